"""Vertex AI batch prediction as the simulated server speaks it, for Gemini (``publishers/google``) and Claude
(``publishers/anthropic``) models, its input and output in the server's Cloud Storage (:mod:`simserver.gcs`); the
batch state and line rules are :mod:`simserver.batches`' (time, expiry, line errors, stats). Mirrors what
google-genai's ``batches`` module sends and reads in Vertex mode (google/genai/batches.py) and the REST reference
(cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.batchPredictionJobs):

    ``POST /v1/projects/{p}/locations/{l}/batchPredictionJobs``  ``{"displayName", "model":
           "publishers/{google|anthropic}/models/{id}", "inputConfig": {"instancesFormat": "jsonl", "gcsSource":
           {"uris": ["gs://..."]}}, "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination":
           {"outputUriPrefix": "gs://..."}}}``: the job, ``JOB_STATE_PENDING``.
    ``GET  .../batchPredictionJobs/{id}``  the job; ``GET .../batchPredictionJobs`` lists the project's jobs in the
           location, newest first (``{"batchPredictionJobs", "nextPageToken"}``, ``pageSize``, ``pageToken`` and a
           ``filter`` of ``display_name`` (= or !=) and ``create_time`` (=, <, <=, >, >=, RFC 3339) terms joined
           by AND; another field is a 400).
    ``POST .../batchPredictionJobs/{id}:cancel``  ``{}``; the job is ``JOB_STATE_CANCELLED`` at the next look.

Refused at create with 400 INVALID_ARGUMENT: a model path that is not a publisher model, an input that is not one
``gs://`` JSONL object the server has, an output that is not a ``gs://`` prefix; a model the server does not know
(when its ``models`` list is set) is a 404 NOT_FOUND. Each input line is ``{"request": <body>}`` (Claude: with
``custom_id``, the id its ``batch_*`` hashes use; Gemini: the request's canonical JSON). A line that is not JSON,
has no ``request``, or whose body the online route would refuse (strict rules included) is an errored line.

Once ended, ``outputInfo.gcsOutputDirectory`` is ``{outputUriPrefix}/prediction-model-{time}`` and holds
``predictions.jsonl``: one line per answered or errored input line, in an order that is not the input's, each
echoing its ``request`` (and Claude's ``custom_id``) with ``"status": ""`` and the ``response``, or a ``status``
such as ``Bad Request: {"error": {"code": 400, "message", "status": "INVALID_ARGUMENT"}}`` (500s: ``Internal
Server Error: ...``). Expired and cancelled lines are left out. States: ``JOB_STATE_RUNNING`` until the end, then
``JOB_STATE_SUCCEEDED``, ``JOB_STATE_EXPIRED`` (a line expired, or ``/sim/batches/{id}/expire``) or
``JOB_STATE_CANCELLED``; ``completionStats`` counts successful, failed and incomplete lines (int64 strings).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any

from aiohttp import web

from .batches import Batch, BatchRoutes, Line, page, rfc3339
from .gcs import objects_of
from .gemini import GeminiFormat
from .vertex import VERTEX_CLAUDE, VERTEX_GEMINI, _known

__all__ = ["VertexBatchRoutes"]

_JOBS = "/v1/projects/{project}/locations/{location}/batchPredictionJobs"
_STATES = {"completed": "JOB_STATE_SUCCEEDED", "expired": "JOB_STATE_EXPIRED", "cancelled": "JOB_STATE_CANCELLED",
           "failed": "JOB_STATE_FAILED"}
_MODEL = re.compile(r"publishers/(google|anthropic)/models/([^/]+)")
_TERM = re.compile(r'\s*(\w+)\s*(!=|>=|<=|=|>|<)\s*"((?:[^"\\]|\\.)*)"\s*')
_REASONS = {400: ("Bad Request", "INVALID_ARGUMENT"), 404: ("Not Found", "NOT_FOUND"),
            429: ("Too Many Requests", "RESOURCE_EXHAUSTED"), 500: ("Internal Server Error", "INTERNAL")}


def _error(code: int, status: str, message: str) -> web.Response:
    return GeminiFormat.error(code, status, message, {})


def _gs(uri: Any) -> tuple[str, str] | None:
    if not isinstance(uri, str) or not uri.startswith("gs://"):
        return None
    bucket, _, name = uri[5:].partition("/")
    return (bucket, name) if bucket else None


def _compare(value: Any, op: str, wanted: Any) -> bool:
    return {"=": value == wanted, "!=": value != wanted, ">": value > wanted, ">=": value >= wanted,
            "<": value < wanted, "<=": value <= wanted}[op]


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def matches(batch: Batch, terms: list[tuple[str, str, str]]) -> bool:
    for field, op, wanted in terms:
        if field == "display_name":
            if not _compare(batch.info.get("displayName") or "", op, wanted):
                return False
        elif not _compare(batch.created, op, _stamp(wanted)):
            return False
    return True


def parse_filter(text: str) -> list[tuple[str, str, str]]:
    """Vertex's list filter, the terms this server reads: ``display_name`` and ``create_time`` joined by AND."""
    terms = []
    for part in re.split(r"\s+AND\s+", text.strip(), flags=re.IGNORECASE) if text.strip() else []:
        found = _TERM.fullmatch(part)
        if found is None or found.group(1) not in ("display_name", "create_time"):
            raise ValueError(f"Unsupported filter: {part.strip()!r}")
        field, op, value = found.groups()
        value = value.replace('\\"', '"').replace("\\\\", "\\")
        if field == "display_name" and op not in ("=", "!="):
            raise ValueError(f"display_name takes = or !=, not {op}")
        if field == "create_time":
            try:
                _stamp(value)
            except ValueError:
                raise ValueError(f"create_time must be an RFC 3339 time, not {value!r}") from None
        terms.append((field, op, value))
    return terms


class VertexBatchRoutes(BatchRoutes):
    """The batch prediction routes of one server."""

    wire = VERTEX_GEMINI

    def add_routes(self, app: web.Application) -> None:
        add = app.router.add_route
        add("POST", _JOBS, self._keyed(self.create))
        add("GET", _JOBS, self._keyed(self.list))
        add("GET", _JOBS + "/{job_id:\\d+}", self._keyed(self.get))
        add("POST", _JOBS + "/{job_id:\\d+}:cancel", self._keyed(self.cancel))

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        if not isinstance(body, dict):
            return _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received. Expected an object.")
        found = _MODEL.fullmatch(str(body.get("model", "")))
        if found is None:
            return _error(400, "INVALID_ARGUMENT", "BatchPredictionJob.model must be a publisher model, "
                          "publishers/{publisher}/models/{model}.")
        publisher, model = found.groups()
        known = _known(self.server)
        if known is not None and model not in known:
            return _error(404, "NOT_FOUND", f"Publisher Model `publishers/{publisher}/models/{model}` not found.")
        source = body.get("inputConfig") or {}
        uris = (source.get("gcsSource") or {}).get("uris") if isinstance(source, dict) else None
        if source.get("instancesFormat") != "jsonl" or not isinstance(uris, list) or len(uris) != 1:
            return _error(400, "INVALID_ARGUMENT", "The simulated server takes one JSONL input in Cloud Storage: "
                          "inputConfig.instancesFormat jsonl and gcsSource.uris with one gs:// URI.")
        where = _gs(uris[0])
        stored = objects_of(self.server).get(*where) if where is not None else None
        if stored is None:
            return _error(400, "INVALID_ARGUMENT", f"Failed to read the input file {uris[0]}: it does not exist or "
                          "is not readable.")
        output = body.get("outputConfig") or {}
        prefix = (output.get("gcsDestination") or {}).get("outputUriPrefix") if isinstance(output, dict) else None
        if output.get("predictionsFormat") != "jsonl" or _gs(prefix) is None:
            return _error(400, "INVALID_ARGUMENT", "The simulated server writes JSONL to Cloud Storage: "
                          "outputConfig.predictionsFormat jsonl and gcsDestination.outputUriPrefix gs://...")
        lines = [self._line(i, row, publisher, model) for i, row in enumerate(stored.data.splitlines())
                 if row.strip()]
        if not lines:
            return _error(400, "INVALID_ARGUMENT", f"The input file {uris[0]} has no requests.")
        match = request.match_info
        info = {"project": match["project"], "location": match["location"], "model": body["model"],
                "displayName": body.get("displayName"), "input": uris[0], "output": prefix,
                "inputConfig": source, "outputConfig": output}
        batch = self.store.add(str(int.from_bytes(os.urandom(7), "big")), "vertex", lines, info, on_end=self._write)
        return web.json_response(self._job(batch, created=True))

    @staticmethod
    def _line(i: int, row: bytes, publisher: str, model: str) -> Line:
        fmt = VERTEX_CLAUDE if publisher == "anthropic" else VERTEX_GEMINI
        try:
            item = json.loads(row)
        except ValueError:
            item = None
        body = item.get("request") if isinstance(item, dict) else None
        custom_id = item.get("custom_id") if isinstance(item, dict) and publisher == "anthropic" else None
        if not isinstance(custom_id, str) or not custom_id:
            custom_id = json.dumps(body, sort_keys=True) if body is not None else f"line {i}"
        echo = {"custom_id": custom_id} if publisher == "anthropic" else {}
        echo["request"] = body if body is not None else row.decode(errors="replace")
        return Line(custom_id, body, fmt, model, echo)

    def _write(self, batch: Batch) -> None:
        """Write the ended job's output: the answered and errored lines, in an order that is not the input's."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 10**6:06d}Z"
        directory = batch.info["output"].rstrip("/") + f"/prediction-model-{stamp}"
        batch.info["outputDirectory"] = directory
        rows = []
        for i, line in enumerate(batch.lines):
            if line.outcome not in ("succeeded", "errored"):
                continue
            row = {**line.metadata, "processed_time": rfc3339(time.time())}
            if line.outcome == "succeeded":
                row.update(status="", response=line.answer)
            else:
                code = line.error.status if line.error is not None else 500
                reason, name = _REASONS.get(code, _REASONS[500 if code >= 500 else 400])
                message = line.error.message if line.error is not None and code < 500 else \
                    "Internal error encountered."
                row["status"] = f"{reason}: " + json.dumps({"error": {"code": code, "message": message,
                                                                       "status": name}})
            order = hashlib.sha256(f"{i}\0{line.custom_id}".encode()).hexdigest()
            rows.append((order, json.dumps(row, ensure_ascii=False)))
        data = "".join(text + "\n" for _, text in sorted(rows)).encode()
        bucket, name = _gs(directory + "/predictions.jsonl") or ("", "")
        objects_of(self.server).put(bucket, name, data, "application/jsonl")

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch = self.store.get(request.match_info["job_id"], "vertex")
        match = request.match_info
        if batch is None or (batch.info["project"], batch.info["location"]) != (match["project"], match["location"]):
            return _error(404, "NOT_FOUND", "The BatchPredictionJob does not exist.")
        return batch

    async def get(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else web.json_response(self._job(batch))

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.end is not None:
            return _error(400, "FAILED_PRECONDITION", f"The BatchPredictionJob {batch.id} is in state "
                          f"{_STATES[batch.end]} and cannot be cancelled.")
        self.store.cancel(batch)
        return web.json_response({})

    async def list(self, request: web.Request) -> web.Response:
        query, match = request.query, request.match_info
        try:
            terms = parse_filter(query.get("filter", ""))
        except ValueError as exc:
            return _error(400, "INVALID_ARGUMENT", str(exc))
        jobs = [b for b in self.store.listed("vertex")
                if (b.info["project"], b.info["location"]) == (match["project"], match["location"])
                and matches(b, terms)]
        chosen, more = page(jobs, lambda b: b.id, query.get("pageSize"), query.get("pageToken"))
        answer: dict[str, Any] = {"batchPredictionJobs": [self._job(b) for b in chosen]}
        if more and chosen:
            answer["nextPageToken"] = chosen[-1].id
        return web.json_response(answer)

    def _job(self, batch: Batch, created: bool = False) -> dict[str, Any]:
        info = batch.info
        name = f"projects/{info['project']}/locations/{info['location']}/batchPredictionJobs/{batch.id}"
        ended = batch.end is not None and not created
        if ended:
            state = _STATES[batch.end or "completed"]
        elif batch.cancel_at is not None:
            state = "JOB_STATE_CANCELLING"
        else:
            state = "JOB_STATE_PENDING" if created else "JOB_STATE_RUNNING"
        updated = batch.ended_at if ended and batch.ended_at is not None else batch.created
        job: dict[str, Any] = {"name": name, "model": info["model"], "inputConfig": info["inputConfig"],
                               "outputConfig": info["outputConfig"], "state": state,
                               "createTime": rfc3339(batch.created), "updateTime": rfc3339(updated)}
        if info.get("displayName") is not None:
            job["displayName"] = info["displayName"]
        if not created:
            job["startTime"] = rfc3339(batch.created)
        if ended:
            n = len(batch.lines)
            succeeded, errored = batch.count("succeeded"), batch.count("errored")
            job["endTime"] = rfc3339(updated)
            job["completionStats"] = {"successfulCount": str(succeeded), "failedCount": str(errored),
                                      "incompleteCount": str(n - succeeded - errored)}
            job["outputInfo"] = {"gcsOutputDirectory": info["outputDirectory"]}
        return job
