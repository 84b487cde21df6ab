"""AWS Bedrock as the simulated server speaks it: the runtime's Converse and InvokeModel (Claude) paths, and the
control plane's model lookups a pre-flight check asks.

    ``POST /model/{modelId}/converse``   Converse (any model): ``messages`` of ``{"text": ...}`` blocks, ``system``,
                                         ``inferenceConfig``, ``outputConfig`` (``textFormat``'s schema: the answer
                                         is an instance of it); answered with ``output.message``, ``stopReason``,
                                         ``usage`` and ``metrics``. Counted as ``bedrock-converse``.
    ``POST /model/{modelId}/invoke``     InvokeModel for Claude: the Anthropic Messages body with
                                         ``anthropic_version: "bedrock-2023-05-31"`` and no ``model`` (it is in the
                                         path), answered in the Messages format. Counted as ``bedrock-invoke``.
    ``GET /foundation-models/{id}``      GetFoundationModel; ``GET /inference-profiles/{id}`` GetInferenceProfile
                                         (cross-region ids such as ``us.anthropic.claude-...``). Lookups, not model
                                         requests: not counted, no fault dice, no rate-limit buckets.

The key is the access key id of a SigV4 ``Authorization: AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/bedrock/
aws4_request, SignedHeaders=..., Signature=...`` header (the signature is not verified), or a Bedrock API key sent
as ``Authorization: Bearer``; ``SimConfig.api_key`` compares it. Every error is Bedrock's shape: the status, an
``x-amzn-ErrorType`` header naming the exception (which botocore reads as the error code) and ``{"message": ...}``
(the exception names and statuses are botocore's service model for bedrock-runtime, ``botocore/data/
bedrock-runtime/2023-09-30/service-2.json``). A model the lookups do not know (``SimConfig.models``; every model by
default) is their 404 ``ResourceNotFoundException``; model requests are answered whatever the model, as on the other
routes. Strict mode's rules are in :mod:`simserver.bedrock_strict`. Batch inference (the control plane's model
invocation jobs) and the S3 it reads and writes are :mod:`simserver.batch_bedrock` and :mod:`simserver.s3`.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runner.providers.bedrock_ids import claude_name

from . import bedrock_strict, strict
from .anthropic import AnthropicFormat
from .buckets import Blocked
from .wire import Ask, Invalid, Thought, WireFormat, compact, positive_int, retry_headers, strings

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["CONVERSE", "INVOKE", "ConverseFormat", "InvokeFormat", "add_routes", "error"]

_SIGV4 = re.compile(r"AWS4-HMAC-SHA256 Credential=([A-Za-z0-9]+)/\d{8}/[a-z0-9-]+/bedrock/aws4_request,\s*"
                    r"SignedHeaders=[a-z0-9;-]+,\s*Signature=[0-9a-f]{64}")
#: the namespace Bedrock's x-amzn-ErrorType values carry after the exception's name
_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"


def error(status: int, code: str, message: str, headers: dict[str, str]) -> web.Response:
    """Bedrock's error response: ``x-amzn-ErrorType: Code:namespace`` and ``{"message": ...}``."""
    return web.Response(status=status, body=compact({"message": message}).encode(),
                        headers={**headers, "Content-Type": "application/json",
                                 "x-amzn-ErrorType": f"{code}:{_NAMESPACE}"})


def access_key(request: web.Request) -> str:
    """The access key id of a well-formed SigV4 header, or a bearer API key; '' when missing or malformed."""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:].strip()
    found = _SIGV4.fullmatch(auth.strip())
    return found.group(1) if found else ""


class _BedrockErrors:
    """The errors both runtime formats answer with, in Bedrock's words."""

    def new_headers(self) -> dict[str, str]:
        return {"x-amzn-RequestId": os.urandom(16).hex()}

    def key(self, request: web.Request) -> str:
        return access_key(request)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return error(403, "MissingAuthenticationTokenException", "Missing Authentication Token", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return error(403, "UnrecognizedClientException", "The security token included in the request is invalid.",
                     headers)

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return error(400, "ValidationException", message, headers)

    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        return error(429, "ThrottlingException", "Too many requests, please wait before trying again.", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        # ServiceQuotaExceededException is InvokeModel's 400 in the service model; the text is the console's
        return error(400, "ServiceQuotaExceededException", "Your request exceeded the service quota for this "
                     "account. Request a quota increase in the Service Quotas console.", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return error(500, "InternalServerException", "The server encountered an internal error.", headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return error(503, "ServiceUnavailableException", "The service is unavailable. Please try again later.",
                     headers)


def _model_of(request: web.Request) -> str:
    """The model the path names (a batch record's: the job's model, as ``model``)."""
    info = request.match_info
    return info["modelId"] if "modelId" in info else info["model"]


def _texts(blocks: Any, where: str) -> str:
    """The text of a list of ``{"text": ...}`` content blocks (the only kind the simulated server answers)."""
    if not isinstance(blocks, list) or not all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in blocks):
        raise Invalid(f"{where}: the simulated server accepts only text content blocks")
    return "".join(b["text"] for b in blocks)


def _parse_converse(body: Any, request: web.Request) -> Ask:
    try:
        return _read_converse(body, request)
    except Invalid as exc:  # what cannot be read is said as the service model's check says it, where it can
        problem = bedrock_strict.converse_refusal(body, _model_of(request), {}, getattr(request, "path", "")) \
            if isinstance(body, dict) else None
        raise Invalid(problem.message if problem is not None else exc.message) from None


def _read_converse(body: Any, request: web.Request) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("Malformed input request, please reformat your input and try again.")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise Invalid("A conversation must start with a user message. Try again with a conversation that starts "
                      "with a user message.")
    messages: list[dict[str, str]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _texts(body["system"], "system")})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise Invalid(f"messages.{i}.role: Member must satisfy enum value set: [user, assistant]")
        messages.append({"role": turn["role"], "content": _texts(turn.get("content"), f"messages.{i}.content")})
    config = body.get("inferenceConfig") or {}
    if not isinstance(config, dict):
        raise Invalid("inferenceConfig: Member must be an object")
    max_tokens, stop = config.get("maxTokens"), config.get("stopSequences")
    if max_tokens is not None and not positive_int(max_tokens):
        raise Invalid("inferenceConfig.maxTokens: Member must have value greater than or equal to 1")
    if stop is not None and not strings(stop):
        raise Invalid("inferenceConfig.stopSequences: Member must be a list of strings")
    ask = Ask(_model_of(request), messages, config.get("temperature"), max_tokens, config.get("topP"), stop or None,
              None)
    output = body.get("outputConfig") or {}
    if not isinstance(output, dict):
        raise Invalid("outputConfig: Member must be an object")
    ask.effort = output.get("effort") if isinstance(output.get("effort"), str) else None
    schema = (((output.get("textFormat") or {}).get("structure") or {}).get("jsonSchema") or {}).get("schema")
    if schema is not None:  # a JSON string (JsonSchemaDefinition.schema): the answer is an instance of it
        try:
            ask.schema = json.loads(schema)
        except (TypeError, ValueError):
            raise Invalid("outputConfig.textFormat.structure.jsonSchema.schema: Member must be a JSON Schema "
                          "document (a JSON object)") from None
        if not isinstance(ask.schema, dict):
            raise Invalid("outputConfig.textFormat.structure.jsonSchema.schema: Member must be a JSON Schema "
                          "document (a JSON object)")
    return ask


class ConverseFormat(_BedrockErrors, WireFormat):
    """Converse's request and answer (``ConverseRequest`` / ``ConverseResponse`` of the service model)."""

    name = "bedrock-converse"
    parse = staticmethod(_parse_converse)

    def answer(self, ask: Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int, thought: Thought | None = None, refusal: str | None = None) -> dict[str, Any]:
        if text is None:  # filtered, or refused: Converse says content_filtered (StopReason enum)
            reason, content = "content_filtered", ([{"text": refusal}] if refusal is not None else [])
        else:
            reason = "max_tokens" if finish == "length" else ("stop_sequence" if stop_hit is not None else "end_turn")
            content = [{"text": text}]
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": reason,
            "usage": {"inputTokens": prompt_tokens, "outputTokens": completion_tokens,
                      "totalTokens": prompt_tokens + completion_tokens},
            "metrics": {"latencyMs": 1},
        }


def _parse_invoke(body: Any, request: web.Request) -> Ask:
    """The Messages body without its model (the path has it); parsed as the Messages API with the Claude name the
    capability table knows, so thinking defaults are the model's."""
    if not isinstance(body, dict):
        raise Invalid("Malformed input request, please reformat your input and try again.")
    model = _model_of(request)
    named = {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}
    named["model"] = claude_name(model) or model
    ask = _ANTHROPIC_PARSE(named, request)
    ask.model = model
    return ask


_ANTHROPIC_PARSE = AnthropicFormat.parse


class InvokeFormat(_BedrockErrors, AnthropicFormat):
    """InvokeModel for Claude: the Messages format's answers, Bedrock's path, key and errors."""

    name = "bedrock-invoke"
    parse = staticmethod(_parse_invoke)

    def rate_headers(self, buckets: list[Any], headers: dict[str, str]) -> None:
        pass  # Bedrock sends no rate-limit headers


CONVERSE = ConverseFormat()
INVOKE = InvokeFormat()
strict.RULES[CONVERSE.name] = bedrock_strict.converse_refusal
strict.RULES[INVOKE.name] = bedrock_strict.invoke_refusal


def _unknown(server: SimServer, model: str) -> bool:
    """Whether the server was told which models it knows (``SimConfig.models``, comma-separated) and this is not
    one of them."""
    names = getattr(server.config, "models", None)
    if not names:
        return False
    known = {name.strip() for name in str(names).split(",") if name.strip()}
    return model not in known


def _lookup_refused(server: SimServer, request: web.Request) -> web.Response | None:
    """A lookup's key check, as the model routes do it (no fault dice)."""
    cfg, headers = server.config, CONVERSE.new_headers()
    if cfg.require_key or cfg.api_key is not None:
        key = access_key(request)
        if not key:
            return CONVERSE.missing_key(headers)
        if cfg.api_key is not None and key != cfg.api_key:
            return CONVERSE.wrong_key(headers)
    return None


def add_routes(server: SimServer, app: web.Application) -> None:
    """Add the runtime's two model routes and the control plane's two lookups to ``app``."""

    async def converse(request: web.Request) -> web.Response:
        return await server.answer(request, CONVERSE)

    async def invoke(request: web.Request) -> web.Response:
        return await server.answer(request, INVOKE)

    async def foundation_model(request: web.Request) -> web.Response:
        # GetFoundationModelResponse.modelDetails (service model of "bedrock", 2023-04-20)
        model = request.match_info["modelId"]
        if (refused := _lookup_refused(server, request)) is not None:
            return refused
        if _unknown(server, model):
            return error(404, "ResourceNotFoundException", f"The model {model} does not exist.", {})
        provider = model.split(".", 1)[0]
        details = {"modelArn": f"arn:aws:bedrock:us-east-1::foundation-model/{model}", "modelId": model,
                   "modelName": model, "providerName": provider, "inputModalities": ["TEXT"],
                   "outputModalities": ["TEXT"], "responseStreamingSupported": True,
                   "inferenceTypesSupported": ["ON_DEMAND"], "modelLifecycle": {"status": "ACTIVE"}}
        return web.json_response({"modelDetails": details})

    async def inference_profile(request: web.Request) -> web.Response:
        # GetInferenceProfileResponse (service model of "bedrock", 2023-04-20)
        profile = request.match_info["modelId"]
        if (refused := _lookup_refused(server, request)) is not None:
            return refused
        if _unknown(server, profile):
            return error(404, "ResourceNotFoundException", f"The inference profile {profile} does not exist.", {})
        base = profile.split(".", 1)[1] if "." in profile else profile
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0))
        return web.json_response({
            "inferenceProfileName": profile, "inferenceProfileId": profile, "status": "ACTIVE",
            "inferenceProfileArn": f"arn:aws:bedrock:us-east-1:000000000000:inference-profile/{profile}",
            "models": [{"modelArn": f"arn:aws:bedrock:us-east-1::foundation-model/{base}"}],
            "type": "SYSTEM_DEFINED", "createdAt": stamp, "updatedAt": stamp})

    app.router.add_post("/model/{modelId:.+}/converse", converse)
    app.router.add_post("/model/{modelId:.+}/invoke", invoke)
    app.router.add_get("/foundation-models/{modelId:.+}", foundation_model)
    app.router.add_get("/inference-profiles/{modelId:.+}", inference_profile)
    from . import batch_bedrock  # batch inference and the S3 it reads and writes (it imports this module)

    batch_bedrock.add_routes(server, app)
