"""Vertex AI batch prediction for Gemini and for Claude on Vertex, through google-genai's ``client.aio.batches`` in
Vertex mode, its input and output staged in Cloud Storage (:mod:`runner.providers.gcs_files`).

Submit: the lines are written as one JSONL object, ``{batch_folder}/{digest}/input.jsonl`` (``digest``: the one
that ends the batch's label, :func:`~runner.providers.batching.batch_label`, so a resumed process names the same
object), and a job is created on it with ``src="gs://.../input.jsonl"``, ``dest="gs://.../{digest}/output"`` and
the label as ``display_name``. The job id is its resource name, ``projects/P/locations/L/batchPredictionJobs/N``.

* A Gemini line is ``{"request": <GenerateContentRequest>}``, the body google-genai sends online for the same
  contents and config (``GeminiProvider.request_of``, then the SDK's own request conversion). Source:
  cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-from-cloud-storage ("Each line in the
  batch input data is a request to the model, following the same format for Gemini API"). That page documents no
  custom id for Gemini lines; each output line echoes its ``request`` and the output order is not the input's. So
  the custom ids, in input order, are kept beside the input as ``{digest}/custom_ids.json``, and each request
  carries its line's position as a label, ``"labels": {"runner_line": "17"}`` (GenerateContentRequest.labels:
  "used for billing and reporting only", cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.
  endpoints/generateContent; the answer does not depend on it). An output line is matched by the label its echoed
  request carries, else by the echoed request itself, compared without labels, with snake_case keys, no empty
  fields and floats to 6 significant digits (the echo may be re-encoded from Vertex's protobuf).
* A Claude line is ``{"custom_id": ..., "request": <Messages body, anthropic_version "vertex-2023-10-16">}``, the
  body the online path sends (``AnthropicProvider.request_of``). Source:
  cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude/batch ("custom_id: An ID for each request to
  match the input with the output"). A Claude output line is matched by its ``custom_id`` (else by its request).

Results: the JSONL objects under the job's ``outputInfo.gcsOutputDirectory`` (``prediction-model-<time>/
predictions.jsonl``). A line with a ``response`` is a completion built as online; one whose ``status`` is not empty
failed: its status is Google's words, ``"Bad Request: {"error": {"code": 400, "message", "status"}}"``, and maps
as the online mapping of that HTTP status (a status without a JSON error by its words, "Bad Request" a 400, and
as a 500, retried, when they are not known). Input lines missing
from the output (a job expired, cancelled or failed part-way) come back ``retry`` (expired or cancelled). A job that
failed as a whole with no output raises its error. The staged objects are kept (see docs/clouds.md: a results read must
be repeatable after a crash, and the engine has no hook after it recorded a batch as collected); a lifecycle rule
on the bucket removes them.

Find: ``batches.list`` with Vertex's ``filter`` (``display_name="LABEL" AND create_time>="RFC 3339"``), excluding
``known``. Limits: a Gemini batch job takes up to 200,000 requests and an input file of up to 1 GB
(cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-gemini, "Quotas and limits"):
:meth:`VertexBatches.chunks` keeps each batch within both.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from runner.errors import BadRequest, ProviderError

from ._batch_common import (
    SDKBatches,
    answered,
    check_lines,
    described,
    failed,
    malformed,
    mapped,
    not_ended,
    safe_label,
    status_error,
    unfinished,
)
from .batching import CANCELLED, CLOCK_SKEW, ENDED, EXPIRED, RUNNING, BatchLine, BatchResult, BatchStatus, Lookup
from .gemini_batch import _ENDED, _RPC, _field

if TYPE_CHECKING:
    from .gcs_files import Staging
    from .vertex import VertexProvider

#: a Vertex resource's display name: at most 128 characters
_DISPLAY_NAME = 128
#: jobs a list page holds in ``find``
PAGE = 100
#: Gemini batch prediction's limits per job (batch-prediction-gemini, "Quotas and limits"): 200,000 requests and an
#: input file of 1 GB; a tenth of the bytes is left for what this measure and Google's may differ by
MAX_LINES = 200_000
MAX_BYTES = 1_000_000_000 * 9 // 10
INPUT = "input.jsonl"
IDS = "custom_ids.json"
#: the label a Gemini line's request carries: its position in the input
LINE_LABEL = "runner_line"
#: the HTTP status words Google's batch output puts before a line's error JSON
_REASONS = {"bad request": 400, "unauthorized": 401, "forbidden": 403, "not found": 404,
            "too many requests": 429, "resource exhausted": 429, "internal server error": 500,
            "service unavailable": 503, "deadline exceeded": 504}


def digest_of(label: str) -> str:
    """The digest a batch label ends in (the folder of its objects), or one of the whole label."""
    head, mark, digest = label.rpartition(" #")
    if mark and digest.isalnum():
        return digest
    return hashlib.sha256(label.encode()).hexdigest()[:32]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _normal(value: Any) -> Any:
    """``value`` as an echo of it would compare: snake_case keys, no empty fields, floats to 6 significant digits."""
    if isinstance(value, dict):
        pairs = ((_snake(str(k)), _normal(v)) for k, v in value.items())
        return {k: v for k, v in pairs if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, float):
        rounded = float(f"{value:.6g}")
        return int(rounded) if rounded.is_integer() else rounded
    return value


def canonical(request: Any) -> str:
    """A request as canonical JSON, for matching an output line's echo to its input line (labels left out)."""
    body = {k: v for k, v in request.items() if k != "labels"} if isinstance(request, dict) else request
    return json.dumps(_normal(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def labelled_line(request: Any, lines: int) -> int | None:
    """The input position an echoed request's ``runner_line`` label names, when it names one of ``lines``."""
    labels = request.get("labels") if isinstance(request, dict) else None
    value = labels.get(LINE_LABEL) if isinstance(labels, dict) else None
    if isinstance(value, str) and value.isdigit() and int(value) < lines:
        return int(value)
    return None


def _state(job: Any) -> str:
    return str(getattr(job.state, "value", job.state))


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def line_error(status: Any) -> tuple[int, dict[str, Any]]:
    """A failed output line's ``status`` (Google's words, maybe with a JSON error after them, or an object) as an
    HTTP status and an error object ``{"code", "message", "status"?, "details"?}``."""
    if isinstance(status, dict):
        error = status.get("error", status)
    else:
        text = str(status)
        start = text.find("{")
        error = {}
        if start >= 0:
            try:
                parsed = json.loads(text[start:])
                error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
            except ValueError:
                error = {}
        if not isinstance(error, dict) or not error:
            reason = text[:start if start >= 0 else len(text)].strip(" :").lower()
            error = {"code": _REASONS.get(reason, 500), "message": text}
    code = error.get("code")
    if isinstance(code, int) and code < 100:  # a google.rpc.Code
        code, name = _RPC.get(code, (500, "UNKNOWN"))
        error = {**error, "status": error.get("status", name)}
    if not isinstance(code, int):
        code = 500
    return code, {**error, "code": code}


class VertexBatches(SDKBatches):
    """The batch prediction of a :class:`~runner.providers.vertex.VertexProvider`, for Gemini and Claude models."""

    provider: VertexProvider

    def __init__(self, provider: VertexProvider, staging: Staging) -> None:
        super().__init__(provider)
        self.staging = staging

    @property
    def client(self) -> Any:
        if self.provider.gemini.client is None:
            raise RuntimeError("the provider's start() was not awaited")
        return self.provider.gemini.client

    def errors(self) -> Any:
        """The batch API's errors (google-genai's) as the runner's, with Vertex's words for refused credentials."""
        return self.provider.map_errors("batch prediction", through_genai=True)

    # -- the input lines --------------------------------------------------------------------------------
    def request(self, model: str, line: BatchLine) -> dict[str, Any]:
        """The body the online path sends for ``line`` to ``model`` (Claude: with its ``anthropic_version``)."""
        from .vertex import VERTEX_ANTHROPIC_VERSION, is_claude

        if is_claude(model):
            kwargs, sampling = self.provider.claude.request_of(line.messages, line.params, model)
            return {**kwargs, **sampling, "anthropic_version": VERTEX_ANTHROPIC_VERSION}
        from google.genai import _common, models, types

        contents, config = self.provider.gemini.request_of(line.messages, line.params, model)
        parameters = types._GenerateContentParameters(model=model, contents=contents, config=config)
        # google-genai's own conversion of generate_content's parameters to Vertex's body (google/genai/models.py,
        # AsyncModels.generate_content): the online request, without its URL part
        body = models._GenerateContentParameters_to_vertex(self.client._api_client, parameters, None, parameters)
        for internal in ("_url", "_query", "config"):
            body.pop(internal, None)
        return _common.encode_unserializable_types(_common.convert_to_dict(body))  # type: ignore[no-any-return]

    def jsonl(self, model: str, lines: list[BatchLine]) -> list[bytes]:
        from .vertex import is_claude

        claude = is_claude(model)
        rows = []
        for position, line in enumerate(lines):
            row: dict[str, Any] = {"custom_id": line.custom_id} if claude else {}
            try:
                row["request"] = self.request(model, line)
            except ValueError as exc:  # google-genai refuses to build it (no contents): so would it online
                raise BadRequest(f"{self.where}: the request of batch line {line.custom_id} cannot be built: "
                                 f"{exc}") from exc
            if not claude:
                row["request"]["labels"] = {LINE_LABEL: str(position)}
            rows.append(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        return rows

    def chunks(self, model: str, lines: list[BatchLine]) -> list[list[BatchLine]]:
        """``lines`` in order, cut into batches within :data:`MAX_LINES` lines and :data:`MAX_BYTES` of JSONL (a
        single larger line goes alone, for Vertex to refuse with its own error)."""
        parts: list[list[BatchLine]] = []
        part: list[BatchLine] = []
        size = 0
        for line, row in zip(lines, self.jsonl(model, lines), strict=True):
            if part and (size + len(row) > MAX_BYTES or len(part) >= MAX_LINES):
                parts.append(part)
                part, size = [], 0
            part.append(line)
            size += len(row)
        if part:
            parts.append(part)
        return parts

    @staticmethod
    def model_path(model: str) -> str:
        from .vertex import is_claude

        return f"publishers/anthropic/models/{model}" if is_claude(model) else f"publishers/google/models/{model}"

    # -- the Batches contract -------------------------------------------------------------------------
    async def submit(self, model: str, lines: list[BatchLine], *, label: str) -> str:
        check_lines(self.where, lines)
        folder = digest_of(label)
        source = await self.staging.upload(self.staging.folder.name(folder, INPUT), b"".join(self.jsonl(model, lines)))
        ids = json.dumps([line.custom_id for line in lines]).encode()
        await self.staging.upload(self.staging.folder.name(folder, IDS), ids)
        config = {"dest": self.staging.folder.uri(folder, "output"),
                  "display_name": safe_label(label, self.provider, _DISPLAY_NAME)}
        try:
            with self.errors():
                job = await self.client.aio.batches.create(model=self.model_path(model), src=source, config=config)
        except BadRequest as exc:  # why Vertex refused the job (its input, the model) is worth keeping
            cause = exc.__cause__
            raise described(exc, self.where, getattr(cause, "code", None), getattr(cause, "status", None),
                            message=getattr(cause, "message", None)) from cause
        return str(job.name)

    async def find(self, label: str, custom_ids: Collection[str], *, since: float,
                   known: Collection[str] = ()) -> Lookup:
        wanted = safe_label(label, self.provider, _DISPLAY_NAME)
        after = dt.datetime.fromtimestamp(since - CLOCK_SKEW, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        quoted = wanted.replace("\\", "\\\\").replace('"', '\\"')
        config = {"page_size": PAGE, "filter": f'display_name="{quoted}" AND create_time>="{after}"'}
        with self.errors():
            async for job in await self.client.aio.batches.list(config=config):
                created = job.create_time.timestamp() if job.create_time is not None else since
                if job.display_name == wanted and created >= since - CLOCK_SKEW and job.name not in known:
                    return Lookup(str(job.name))
        return Lookup()

    async def _get(self, batch_id: str) -> Any:
        with self.errors():
            return await self.client.aio.batches.get(name=batch_id)

    async def status(self, batch_id: str) -> BatchStatus:
        job = await self._get(batch_id)
        state = _state(job)
        stats = job.completion_stats
        succeeded = _count(getattr(stats, "successful_count", 0))
        failures = _count(getattr(stats, "failed_count", 0))
        incomplete = _count(getattr(stats, "incomplete_count", 0))
        return BatchStatus(ENDED if state in _ENDED else RUNNING, state, total=succeeded + failures + incomplete,
                           succeeded=succeeded, failed=failures)

    async def results(self, batch_id: str) -> list[BatchResult]:
        job = await self._get(batch_id)
        state = _state(job)
        if state not in _ENDED:
            raise not_ended(self.where, batch_id, state)
        claude = "publishers/anthropic/" in str(job.model or "")
        source = (job.src.gcs_uri or [None])[0] if job.src is not None else None
        if not source:
            raise BadRequest(f"{self.where}: batch {batch_id} has no Cloud Storage input to read its lines from")
        ids, requests = await self._inputs(source)
        directory = getattr(job.output_info, "gcs_output_directory", None) if job.output_info else None
        outputs = await self._outputs(directory) if directory else []
        if not outputs and job.error is not None and state != "JOB_STATE_CANCELLED":
            raise self._job_error(job.error)  # the job failed as a whole: no line was run
        by_request: dict[str, list[str]] = {}
        for custom_id, request in zip(ids, requests, strict=True):
            by_request.setdefault(request, []).append(custom_id)
        results: dict[str, BatchResult] = {}
        known = set(ids)
        with malformed(self.where):
            for row in outputs:
                custom_id = row.get("custom_id") if claude else None
                position = None if claude else labelled_line(row.get("request"), len(ids))
                if position is not None:
                    custom_id = ids[position]
                if not isinstance(custom_id, str) or custom_id not in known:
                    twins = by_request.get(canonical(row.get("request")), [])
                    custom_id = next((c for c in twins if c not in results), None)
                if custom_id is None or custom_id in results:
                    continue  # an answer to no line of this batch
                results[custom_id] = await self._line(custom_id, row, claude)
        kind = CANCELLED if state == "JOB_STATE_CANCELLED" else EXPIRED
        return [results.get(c) or unfinished(c, self.where, kind) for c in ids]

    async def _inputs(self, source: str) -> tuple[list[str], list[str]]:
        """The batch's custom ids, in input order, and each line's request as canonical JSON."""
        folder = source.rpartition("/")[0]
        raw_ids = await self.staging.download(f"{folder}/{IDS}")
        data = await self.staging.download(source)
        with malformed(self.where):
            ids = [str(c) for c in json.loads(raw_ids)]
            requests = [canonical(json.loads(row).get("request")) for row in data.splitlines() if row.strip()]
            if len(requests) != len(ids):
                raise ValueError("the input and its custom ids differ in length")
        return ids, requests

    async def _outputs(self, directory: str) -> list[dict[str, Any]]:
        rows = []
        for uri in await self.staging.list(directory.rstrip("/") + "/"):
            if not uri.endswith(".jsonl"):
                continue
            data = await self.staging.download(uri)
            with malformed(self.where):
                rows += [json.loads(row) for row in data.splitlines() if row.strip()]
        return rows

    async def _line(self, custom_id: str, row: dict[str, Any], claude: bool) -> BatchResult:
        raw = {key: value for key, value in row.items() if key != "request"}
        status = row.get("status")
        if not status and row.get("response") is not None:
            if claude:
                return answered(custom_id, lambda: self.provider.claude.completion_of(row["response"]), raw)
            return answered(custom_id, lambda: self.provider.gemini.completion_of(_gemini_response(row["response"])),
                            raw)
        code, error = line_error(status or {"code": 500, "message": "the line has neither a response nor a status"})
        message = str(error.get("message") or "")
        if claude:
            return failed(custom_id, await self._claude_error(code, error, message), raw)
        return failed(custom_id, self._gemini_error(code, error, message), raw)

    def _gemini_error(self, code: int, error: dict[str, Any], message: str) -> ProviderError:
        from google.genai import errors

        details = [d for d in error.get("details") or [] if isinstance(d, dict)]
        body = {"error": {"code": code, "message": message, "status": error.get("status"), "details": details}}
        sdk_error = errors.ClientError(code, body) if code < 500 else errors.ServerError(code, body)
        return described(mapped(_Mapping(self.provider, "gemini"), sdk_error), self.where, code, error.get("status"),
                         param=_field(message, details), message=message)

    async def _claude_error(self, code: int, error: dict[str, Any], message: str) -> ProviderError:
        import anthropic

        client = await self.provider._claude_client()
        kind = error.get("type") or error.get("status")
        body = {"type": "error", "error": {"type": kind or "api_error", "message": message}}
        sdk_error = status_error(anthropic, client, code, body, "/v1/messages")
        return described(mapped(_Mapping(self.provider, "claude"), sdk_error), self.where, code, kind,
                         message=message)

    def _job_error(self, error: Any) -> ProviderError:
        code = getattr(error, "code", None)
        status, name = _RPC.get(code if isinstance(code, int) else 2, (500, "UNKNOWN"))
        message = str(getattr(error, "message", "") or "")
        return self._gemini_error(status, {"status": name}, message)

    async def _cancel(self, batch_id: str) -> None:
        with self.errors():
            await self.client.aio.batches.cancel(name=batch_id)


class _Mapping:
    """The provider's online mapping of one family's SDK errors, as :func:`mapped` takes it."""

    def __init__(self, provider: VertexProvider, family: str) -> None:
        self.provider = provider
        self.model = "claude-" if family == "claude" else "gemini"
        self.client = None

    def api_key(self) -> str:
        return ""

    def map_errors(self) -> Any:
        return self.provider.map_errors(self.model)


def _gemini_response(body: dict[str, Any]) -> Any:
    """A generateContent answer's JSON as google-genai's ``GenerateContentResponse``, converted as the SDK converts
    an online answer in Vertex mode (google/genai/models.py, ``_GenerateContentResponse_from_vertex``)."""
    from google.genai import models, types

    converted = models._GenerateContentResponse_from_vertex(body, None, None)
    return types.GenerateContentResponse._from_response(response=converted, kwargs={})
