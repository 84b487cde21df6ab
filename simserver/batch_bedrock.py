"""AWS Bedrock batch inference (model invocation jobs) as the simulated server speaks it: the control plane's four
operations on the paths and JSON shapes of botocore's ``bedrock`` service model (``botocore/data/bedrock/
2023-04-20/service-2.json``), the records read from and the answers written to the server's S3 (:mod:`simserver.s3`).

    ``POST /model-invocation-job``                    CreateModelInvocationJob: ``{"jobArn"}``.
    ``GET  /model-invocation-job/{jobIdentifier}``    GetModelInvocationJob (the ARN or the 12-character id).
    ``GET  /model-invocation-jobs``                   ListModelInvocationJobs: ``nameContains``, ``statusEquals``,
                                                      ``submitTimeAfter`` / ``Before``, ``sortOrder`` (newest first
                                                      by default), ``maxResults``, ``nextToken``.
    ``POST /model-invocation-job/{jobIdentifier}/stop``  StopModelInvocationJob.

A create body is checked against the service model's ``CreateModelInvocationJobRequest`` (members, required ones,
types, enums, lengths, ranges, as :mod:`simserver.bedrock_strict` checks Converse; and the string patterns of
``jobName``, ``roleArn``, ``modelId``, ``clientRequestToken`` and the ``s3Uri``\\ s): a 400 ``ValidationException``.
The same ``clientRequestToken`` again returns the job it made ("If this token matches a previous request, Amazon
Bedrock ignores the request, but does not return an error": the API reference); a name already taken by another
job is a ``ConflictException``.

The input (the ``s3Uri`` object, or every ``.jsonl`` under it as a folder) is read when the job is made: a line that
is not ``{"recordId", "modelInput": {...}}``, a missing input, or fewer records than the minimum (100, the
"Minimum number of records per batch inference job" quota) make the job ``Failed`` with a ``message``: Bedrock checks
these while the job is ``Validating`` ("Your files fulfill the requirements for file size and number of records", the
``ListModelInvocationJobs`` ``statusEquals`` reference), not at create. Each record is answered as the online route
answers its body: ``Converse`` jobs as ``POST /model/{id}/converse``, ``InvokeModel`` jobs as ``/invoke`` (Claude),
strict mode's rules included; a refused body is an error record ``{"errorCode": 400, "errorMessage"}``.

Time, expiry and line errors are :class:`~simserver.batches.BatchStore`'s (``batch_delay``, ``batch_expire``,
``batch_line_errors``, ``/sim/batches/{job id}/expire``), and so are the stats. Statuses: ``Validating`` in the
first tenth of the delay, then ``InProgress``, ``Stopping`` after a stop; at the end ``Completed``, ``Stopped``,
``Failed``, or for a job whose records did not all run, ``PartiallyCompleted`` (some ran) or ``Expired`` (none).
At the end the output is written under ``{outputDataConfig.s3Uri}/{job id}/``: ``{input file name}.out``, one
``{"recordId", "modelInput", "modelOutput" | "error"}`` line per record that ran, in no particular order (here the
reverse of the input's), and ``manifest.json.out`` with the counts (batch-inference-results.html).
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from . import s3
from .batches import Batch, BatchRoutes, Line, rfc3339
from .bedrock import CONVERSE, INVOKE, error
from .bedrock_strict import _check
from .wire import compact

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["BedrockJobs", "MIN_RECORDS"]

PROVIDER = "bedrock"
MIN_RECORDS = 100
_ACCOUNT = "000000000000"
_REGION = re.compile(r"Credential=[A-Za-z0-9]+/\d{8}/([a-z0-9-]+)/")
_DAY_HOURS = 24


@functools.cache
def _operation(name: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("bedrock").operation_model(name)


def _pattern_problem(value: Any, shape: Any, where: str) -> str | None:
    """The first string in ``value`` that does not match its shape's ``pattern``, in AWS's validation words."""
    if shape.type_name == "structure" and isinstance(value, dict):
        for key, item in value.items():
            if key in shape.members and (problem := _pattern_problem(item, shape.members[key],
                                                                     f"{where}.{key}" if where else key)):
                return problem
    elif shape.type_name == "string" and isinstance(value, str):
        pattern = shape.metadata.get("pattern")
        if pattern and not re.fullmatch(pattern, value):
            return (f"1 validation error detected: Value '{value}' at '{where}' failed to satisfy constraint: "
                    f"Member must satisfy regular expression pattern: {pattern}")
    return None


def _invalid(body: Any) -> str | None:
    shape = _operation("CreateModelInvocationJob").input_shape
    return _check(body, shape, "") or _pattern_problem(body, shape, "")


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class BedrockJobs(BatchRoutes):
    """The control plane's batch inference routes on one server."""

    wire = CONVERSE  # its key check and Bedrock's error shapes

    def add_routes(self, app: web.Application) -> None:
        add = app.router.add_route
        add("POST", "/model-invocation-job", self._keyed(self.create))
        add("GET", "/model-invocation-jobs", self._keyed(self.listed))
        add("POST", "/model-invocation-job/{ident:.+}/stop", self._keyed(self.stop))
        add("GET", "/model-invocation-job/{ident:.+}", self._keyed(self.get))

    # -- create ----------------------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return error(400, "ValidationException", "Malformed input request, please reformat your input and try "
                         "again.", {})
        if (problem := _invalid(body)) is not None:
            return error(400, "ValidationException", problem, {})
        token = body.get("clientRequestToken")
        for batch in self.store.batches.values():
            if batch.provider != PROVIDER:
                continue
            if token is not None and batch.info["clientRequestToken"] == token:
                return web.json_response({"jobArn": batch.info["jobArn"]})
            if batch.info["jobName"] == body["jobName"]:
                return error(409, "ConflictException", f"A batch inference job named {body['jobName']} already "
                             "exists.", {})
        found = _REGION.search(request.headers.get("Authorization", ""))
        job_id = os.urandom(6).hex()
        arn = f"arn:aws:bedrock:{found.group(1) if found else 'us-east-1'}:{_ACCOUNT}:model-invocation-job/{job_id}"
        kind = body.get("modelInvocationType") or "InvokeModel"
        input_uri = body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        lines, files, problem = self._records(input_uri, body["modelId"], kind)
        info = {"jobArn": arn, "jobName": body["jobName"], "modelId": body["modelId"], "roleArn": body["roleArn"],
                "clientRequestToken": token, "inputDataConfig": body["inputDataConfig"],
                "outputDataConfig": body["outputDataConfig"], "modelInvocationType": kind,
                "timeoutDurationInHours": body.get("timeoutDurationInHours") or _DAY_HOURS, "files": files,
                "message": problem, "records": len(lines)}
        batch = self.store.add(job_id, PROVIDER, [] if problem else lines, info, self._write_output)
        if problem:
            self.store.fail(batch)
        return web.json_response({"jobArn": arn})

    def _records(self, uri: str, model: str, kind: str) -> tuple[list[Line], list[str], str | None]:
        """The job's records from its input (an object, or the ``.jsonl`` objects under a folder), the input
        files' names, and why validation fails the job (None when it does not)."""
        bucket, key = _split(uri)
        stored = s3.objects(self.server)
        if (bucket, key) in stored:
            keys = [key]
        else:
            folder = key.rstrip("/") + "/" if key else ""
            keys = sorted(k for (b, k) in stored if b == bucket and k.startswith(folder) and k.endswith(".jsonl"))
        if not keys:
            return [], [], f"No .jsonl input file was found at {uri}."
        fmt = CONVERSE if kind == "Converse" else INVOKE
        lines: list[Line] = []
        seen: set[str] = set()
        for name in keys:
            for number, raw in enumerate(stored[(bucket, name)].data.decode("utf-8", "replace").splitlines(), 1):
                if not raw.strip():
                    continue
                try:
                    item = json.loads(raw)
                except ValueError:
                    item = None
                record = item.get("recordId") if isinstance(item, dict) else None
                if not isinstance(item, dict) or not isinstance(item.get("modelInput"), dict):
                    return [], keys, f"Invalid record at line {number} of {name}: each line must be a JSON object " \
                                     "with a modelInput object."
                record = record if isinstance(record, str) and record else f"{len(lines):011d}"
                if record in seen:
                    return [], keys, f"Duplicate recordId {record} at line {number} of {name}."
                seen.add(record)
                lines.append(Line(record, item["modelInput"], fmt, model=model))
        if len(lines) < MIN_RECORDS:
            return lines, keys, f"The job's input has {len(lines)} records, fewer than the minimum of {MIN_RECORDS} " \
                                "records per batch inference job."
        return lines, keys, None

    # -- the job ---------------------------------------------------------------------------------------

    def _job(self, request: web.Request) -> Batch | web.Response:
        ident = unquote(request.match_info["ident"])
        batch = self.store.get(ident.rsplit("/", 1)[-1], PROVIDER)
        if batch is None:
            return error(404, "ResourceNotFoundException", f"The batch inference job {ident} was not found.", {})
        return batch

    def _status(self, batch: Batch) -> str:
        if batch.end == "failed":
            return "Failed"
        if batch.end == "cancelled":
            return "Stopped"
        if batch.end == "expired":
            ran = batch.count("succeeded") + batch.count("errored")
            return "PartiallyCompleted" if ran else "Expired"
        if batch.end == "completed":
            return "Completed"
        if batch.cancel_at is not None:
            return "Stopping"
        return "Validating" if self.store.elapsed(batch) < 0.1 * batch.delay else "InProgress"

    def _json(self, batch: Batch) -> dict[str, Any]:
        info = batch.info
        status = self._status(batch)
        item: dict[str, Any] = {
            key: info[key] for key in ("jobArn", "jobName", "modelId", "roleArn", "inputDataConfig",
                                       "outputDataConfig", "modelInvocationType", "timeoutDurationInHours")}
        item.update({"status": status, "submitTime": rfc3339(batch.created),
                     "lastModifiedTime": rfc3339(batch.ended_at or batch.created),
                     "jobExpirationTime": rfc3339(batch.created + 3600 * info["timeoutDurationInHours"])})
        if info["clientRequestToken"] is not None:
            item["clientRequestToken"] = info["clientRequestToken"]
        if info["message"]:
            item["message"] = info["message"]
        if batch.ended_at is not None:
            item["endTime"] = rfc3339(batch.ended_at)
        if status != "Validating":
            succeeded, errored = batch.count("succeeded"), batch.count("errored")
            item.update({"totalRecordCount": info["records"], "processedRecordCount": succeeded + errored,
                         "successRecordCount": succeeded, "errorRecordCount": errored})
        return item

    async def get(self, request: web.Request) -> web.Response:
        batch = self._job(request)
        return batch if isinstance(batch, web.Response) else web.json_response(self._json(batch))

    async def stop(self, request: web.Request) -> web.Response:
        batch = self._job(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is not None:
            return error(400, "ValidationException", f"The batch inference job is {self._status(batch)} and "
                         "cannot be stopped.", {})
        self.store.cancel(batch)
        return web.json_response({})

    async def listed(self, request: web.Request) -> web.Response:
        from botocore.utils import parse_timestamp

        query = request.query
        jobs = self.store.listed(PROVIDER)  # newest first
        if query.get("sortOrder") == "Ascending":
            jobs.reverse()
        if name := query.get("nameContains"):
            jobs = [b for b in jobs if name in b.info["jobName"]]
        if status := query.get("statusEquals"):
            jobs = [b for b in jobs if self._status(b) == status]
        for bound, keep in (("submitTimeAfter", lambda b, t: b.created >= t),
                            ("submitTimeBefore", lambda b, t: b.created <= t)):
            if query.get(bound):
                moment = parse_timestamp(query[bound]).timestamp()
                jobs = [b for b in jobs if keep(b, moment)]
        start = int(query.get("nextToken") or 0)
        size = max(1, min(int(query.get("maxResults") or 1000), 1000))
        chosen = jobs[start:start + size]
        answer: dict[str, Any] = {"invocationJobSummaries": [self._json(b) for b in chosen]}
        if start + size < len(jobs):
            answer["nextToken"] = str(start + size)
        return web.json_response(answer)

    # -- output ----------------------------------------------------------------------------------------

    def _write_output(self, batch: Batch) -> None:
        """The ``.out`` file of the records that ran (in reverse order: Bedrock promises none) and the manifest."""
        info = batch.info
        bucket, key = _split(info["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        folder = "/".join(part for part in (key.rstrip("/"), batch.id) if part)
        records: list[dict[str, Any]] = []
        tokens_in = tokens_out = 0
        for line in reversed(batch.lines):
            item: dict[str, Any] = {"recordId": line.custom_id, "modelInput": line.body}
            if line.outcome == "succeeded" and line.answer is not None:
                item["modelOutput"] = line.answer
                usage = line.answer.get("usage") or {}
                tokens_in += usage.get("inputTokens") or usage.get("input_tokens") or 0
                tokens_out += usage.get("outputTokens") or usage.get("output_tokens") or 0
            elif line.outcome == "errored" and line.error is not None:
                item["error"] = {"errorCode": line.error.status, "errorMessage": line.error.message}
            else:
                continue  # expired or stopped before it ran: not in the output
            records.append(item)
        name = info["files"][0].rsplit("/", 1)[-1] if info["files"] else "input.jsonl"
        s3.put(self.server, bucket, f"{folder}/{name}.out", "".join(compact(r) + "\n" for r in records).encode())
        manifest = {"totalRecordCount": info["records"], "processedRecordCount": len(records),
                    "successRecordCount": batch.count("succeeded"), "errorRecordCount": batch.count("errored"),
                    "inputTokenCount": tokens_in, "outputTokenCount": tokens_out}
        s3.put(self.server, bucket, f"{folder}/manifest.json.out", compact(manifest).encode())


def add_routes(server: SimServer, app: web.Application) -> None:
    BedrockJobs(server).add_routes(app)
    s3.add_routes(server, app)
