"""AWS Bedrock batch inference (model invocation jobs) through boto3's ``bedrock`` and ``s3`` clients.

Submit: the lines go to S3 as one JSONL object, ``{batch_folder}/inputs/{digest}.jsonl`` (the digest of the batch's
label, so a later process finds the same object), one ``{"recordId": custom id, "modelInput": body}`` per line
(docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-data.html). A Claude model's body is the InvokeModel
Messages body the online path sends (``anthropic_version: bedrock-2023-05-31``; the job's ``modelInvocationType``
``InvokeModel``), so thinking, structured output and the capability table's rules apply as online; any other model's
is the Converse request the online path sends, less its ``modelId`` (``modelInvocationType: Converse``, whose
``modelInput`` is "the request body of the Converse API", same page). Then CreateModelInvocationJob with the job's
``roleArn`` (the service role Bedrock assumes to read and write the folder), the output folder
``{batch_folder}/outputs/``, a ``jobName`` made of the label (the service model's pattern, 63 characters at most, the
digest kept whole) and ``clientRequestToken`` ``runner-{digest}``: the same create sent again (a connection cut off
before the answer) returns the same job instead of making a second one (``idempotencyToken`` in botocore's
``bedrock`` service model). The batch id is the job's ARN.

Find: ListModelInvocationJobs with ``nameContains`` the digest and ``submitTimeAfter`` the intent's time (less the
clock skew), the job whose name is exactly the batch's.

Status: GetModelInvocationJob; Submitted, Validating, Scheduled, InProgress and Stopping are running; Completed,
PartiallyCompleted, Failed, Stopped and Expired ended (the ``ModelInvocationJobStatus`` enum); its record counts.

Results: under ``{outputDataConfig.s3Uri}/{job id}/`` Bedrock writes ``{input file name}.out``, one line per record,
``{"recordId", "modelInput", "modelOutput"}`` or ``{..., "error": {"errorCode": status, "errorMessage"}}``, in no
promised order, and ``manifest.json.out`` (batch-inference-results.html). ``modelOutput`` is the InvokeModel or
Converse response body and is read as online (``completion_of`` of the Messages mapping, ``converse_completion``);
an ``error`` is the online mapping of its status (``BedrockProvider.error_of``: 429 and 5xx retried, 400 not). A
record of the input missing from the output of a job that ended Stopped (``batch_cancelled``) or otherwise
(``batch_expired``) is submitted again. A job that Failed with no output (Bedrock refused its input: too few records,
a role that cannot read the folder) fails its records with the job's message, not retried.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from runner.errors import AuthError, BadRequest, ModelSetupError, ProviderError

from ._batch_common import SDKBatches, answered, check_lines, failed, malformed, not_ended, unfinished
from .answer_bounds import bounds_of
from .batching import CANCELLED, CLOCK_SKEW, ENDED, EXPIRED, RUNNING, BatchLine, BatchResult, BatchStatus, Lookup
from .bedrock_ids import claude_name
from .s3_files import Folder, S3Files, split_uri

if TYPE_CHECKING:
    from .bedrock import BedrockProvider

#: ModelInvocationJobStatus values that are final (botocore's bedrock service model)
_ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
#: ``jobName``: at most 63 characters, ``[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}`` (the service model)
_JOB_NAME = 63
#: Bedrock's batch inference quotas (docs.aws.amazon.com/general/latest/gr/bedrock.html#limits_bedrock, defaults,
#: adjustable per account): at least 100 records a job; at most 50,000 records in an input file and in a job; an
#: input file of at most 1 GB
MIN_RECORDS = 100
MAX_RECORDS = 50_000
MAX_FILE_BYTES = 1024**3
#: what one input file may hold, by its bytes: the quota less a tenth, for what the size of a record cannot foresee
FILE_BUDGET = MAX_FILE_BYTES * 9 // 10
#: a record id as the docs show it: letters and digits
_RECORD_ID = re.compile(r"[A-Za-z0-9]+")
#: the error codes S3 answers for a bucket or key that is not there (the S3 API reference's error list)
_MISSING = ("NoSuchBucket", "NoSuchKey", "404")


def digest_of(label: str) -> str:
    """The digest a :func:`~runner.providers.batching.batch_label` ends with (the whole label, made safe, when it
    has none)."""
    head, mark, digest = label.rpartition(" #")
    return digest if mark and digest.isalnum() else re.sub(r"[^A-Za-z0-9]+", "", label)[-32:] or "batch"


def job_name(label: str) -> str:
    """A ``jobName`` for the label: its readable part with runs of other characters as ``-``, cut so that ``-`` and
    the digest fit whole in 63 characters."""
    head, _, _ = label.rpartition(" #")
    digest = digest_of(label)
    readable = re.sub(r"[^A-Za-z0-9]+", "-", head or "runner").strip("-") or "runner"
    return f"{readable[:_JOB_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def job_id(arn: str) -> str:
    """A job's id: the last part of its ARN (``arn:aws:bedrock:REGION:ACCOUNT:model-invocation-job/ID``)."""
    return arn.rsplit("/", 1)[-1]


class BedrockBatches(SDKBatches):
    """Batch inference of a :class:`~runner.providers.bedrock.BedrockProvider` (its S3 folder and service role set)."""

    provider: BedrockProvider

    def __init__(self, provider: BedrockProvider, control: Any, s3: Any) -> None:
        super().__init__(provider)
        self.control = control  #: boto3's ``bedrock`` client
        self.files = S3Files(s3, provider.pool, self.s3_errors, bounds_of(provider.settings))
        folder, role = provider.options.batch_folder, provider.options.batch_role_arn
        assert folder is not None and role is not None, "BedrockProvider.batches() checks both"
        self.folder = Folder.parse(folder)
        self.role = role

    @property
    def client(self) -> Any:
        return self.control

    def errors(self) -> contextlib.AbstractContextManager[None]:
        return self.provider.map_errors("batch inference")

    @contextlib.contextmanager
    def s3_errors(self) -> Iterator[None]:
        """S3's own errors in words about the folder; the rest as Bedrock's."""
        from botocore.exceptions import ClientError

        try:
            with self.errors():
                yield
        except ProviderError as exc:
            cause = exc.__cause__
            code = str(((getattr(cause, "response", None) or {}).get("Error") or {}).get("Code") or "")
            if isinstance(cause, ClientError) and code in _MISSING:
                raise ModelSetupError(f"{self.where}: S3 answered {code} for {self.folder.uri()}: set providers: "
                                      "{bedrock: {batch_folder: s3://BUCKET/PREFIX}} to a bucket these AWS "
                                      "credentials can write") from cause
            raise

    async def _call(self, method: Any, **kwargs: Any) -> Any:
        return await self.provider._call("batch inference", method, self.provider.pool, **kwargs)

    # -- building ---------------------------------------------------------------------------------------

    def model_input(self, model: str, line: BatchLine) -> dict[str, Any]:
        """A record's ``modelInput``: the body the online path sends for ``model``."""
        if claude_name(model) is not None:
            from .bedrock_claude import BEDROCK_ANTHROPIC_VERSION

            messages = self.provider._claude().messages
            kwargs, sampling = messages.request_of(line.messages, line.params, claude_name(model) or model)
            return {"anthropic_version": BEDROCK_ANTHROPIC_VERSION, **kwargs, **sampling}
        request = self.provider.converse_request(model, line.messages, line.params)
        request.pop("modelId")
        return request

    def input_file(self, model: str, lines: list[BatchLine]) -> bytes:
        for line in lines:
            if not _RECORD_ID.fullmatch(line.custom_id):
                raise BadRequest(f"{self.where}: record id {line.custom_id!r} is not letters and digits, which "
                                 "Bedrock batch inference takes")
        return "".join(json.dumps({"recordId": line.custom_id, "modelInput": self.model_input(model, line)},
                                  ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines).encode()

    def chunks(self, model: str, lines: list[BatchLine]) -> list[list[BatchLine]]:
        """``lines`` in as few jobs as the record and file-size quotas allow, of even sizes (no small remainder that
        could fall under the 100 records a job needs)."""
        size = len(self.input_file(model, lines))
        parts = max(-(-len(lines) // MAX_RECORDS), -(-size // FILE_BUDGET), 1)
        step = -(-len(lines) // parts)
        return [lines[i:i + step] for i in range(0, len(lines), step)]

    # -- the Batches contract -------------------------------------------------------------------------------

    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        data = self.input_file(model, lines)
        digest = digest_of(label)
        name = f"{digest}.jsonl"
        await self.files.put(self.folder.bucket, self.folder.key("inputs", name), data)
        response = await self._call(
            self.control.create_model_invocation_job, jobName=job_name(label), roleArn=self.role,
            clientRequestToken=f"runner-{digest}", modelId=model,
            modelInvocationType="InvokeModel" if claude_name(model) is not None else "Converse",
            inputDataConfig={"s3InputDataConfig": {"s3Uri": self.folder.uri("inputs", name),
                                                   "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": self.folder.uri("outputs") + "/"}})
        return str(response["jobArn"])

    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        wanted = job_name(label)
        after = dt.datetime.fromtimestamp(since - CLOCK_SKEW, dt.UTC)
        token: str | None = None
        while True:
            page = await self._call(self.control.list_model_invocation_jobs, nameContains=digest_of(label),
                                    submitTimeAfter=after, maxResults=100, **({"nextToken": token} if token else {}))
            for job in page.get("invocationJobSummaries") or ():
                if job.get("jobName") == wanted and job.get("jobArn") not in known:
                    return Lookup(str(job["jobArn"]))
            token = page.get("nextToken")
            if not token:
                return Lookup()

    async def _job(self, batch_id: str) -> dict[str, Any]:
        try:
            return await self._call(self.control.get_model_invocation_job,  # type: ignore[no-any-return]
                                    jobIdentifier=batch_id)
        except AuthError as exc:  # the online mapping reads a 404 as an unknown model; here the job is unknown
            if exc.error_class != "unknown_model":
                raise
            raise BadRequest(f"{self.where}: Bedrock has no batch inference job {batch_id} in region "
                             f"{self.provider.region()}", status=exc.status) from exc

    async def status(self, batch_id: str) -> BatchStatus:
        job = await self._job(batch_id)
        state = str(job.get("status"))
        return BatchStatus(ENDED if state in _ENDED else RUNNING, state, total=job.get("totalRecordCount") or 0,
                           succeeded=job.get("successRecordCount") or 0, failed=job.get("errorRecordCount") or 0)

    async def results(self, batch_id: str) -> list[BatchResult]:
        job = await self._job(batch_id)
        state = str(job.get("status"))
        if state not in _ENDED:
            raise not_ended(self.where, batch_id, state)
        model = str(job.get("modelId") or "")
        input_uri = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        submitted = await self._record_ids(input_uri)
        found = {}
        for item in await self._output(job, batch_id, input_uri):
            record = item.get("recordId")
            if isinstance(record, str):
                found[record] = self._record(model, item)
        if state == "Failed" and not found:
            said = str(job.get("message") or "no reason given")
            error = BadRequest(f"{self.where}: batch inference job {job_id(batch_id)} failed: {said}")
            return [BatchResult(cid, error=error, retry=False) for cid in submitted]
        missing = CANCELLED if state == "Stopped" else EXPIRED
        results = [found.pop(cid, None) or unfinished(cid, self.where, missing) for cid in submitted]
        return results + list(found.values())

    async def _record_ids(self, input_uri: str) -> list[str]:
        data = await self.files.get(*split_uri(input_uri))
        with malformed(self.where):
            return [json.loads(raw)["recordId"] for raw in data.decode().splitlines() if raw.strip()]

    async def _output(self, job: dict[str, Any], batch_id: str, input_uri: str) -> list[dict[str, Any]]:
        """The records of the job's ``.out`` file ([] when it wrote none)."""
        out_uri = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
        bucket, prefix = split_uri(out_uri.rstrip("/") + "/" + job_id(batch_id) + "/")
        wanted = split_uri(input_uri)[1].rsplit("/", 1)[-1] + ".out"
        keys = [key for key in await self.files.keys(bucket, prefix) if key.rsplit("/", 1)[-1] == wanted]
        items: list[dict[str, Any]] = []
        for key in keys:
            data = await self.files.get(bucket, key)
            with malformed(self.where):
                items.extend(json.loads(raw) for raw in data.decode().splitlines() if raw.strip())
        return [item for item in items if isinstance(item, dict)]

    def _record(self, model: str, item: dict[str, Any]) -> BatchResult:
        custom_id = item["recordId"]
        raw = {key: value for key, value in item.items() if key != "modelInput"}
        output = item.get("modelOutput")
        if isinstance(output, dict):
            if claude_name(model) is not None:
                mapping = self.provider._claude().messages
                return answered(custom_id, lambda: mapping.completion_of(output), raw)
            return answered(custom_id, lambda: self.provider.converse_completion(output), raw)
        error = item.get("error") if isinstance(item.get("error"), dict) else {}
        status = error.get("errorCode")
        status = int(status) if isinstance(status, int | str) and str(status).isdigit() else 500
        said = str(error.get("errorMessage") or "the record has neither modelOutput nor error")
        return failed(custom_id, self.provider.error_of("", status, said, None, model), raw)

    async def _cancel(self, batch_id: str) -> None:
        await self._call(self.control.stop_model_invocation_job, jobIdentifier=batch_id)
