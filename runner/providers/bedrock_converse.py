"""Bedrock's Converse API as the runner speaks it: a request (boto3's keyword arguments for ``converse``, and the
``modelInput`` of a Converse batch record) from the runner's messages and parameters, and a response read back as a
:class:`~runner.providers.base.Completion`. Used by :class:`~runner.providers.bedrock.BedrockProvider` for every
model that is not Claude (Claude goes through InvokeModel: :mod:`runner.providers.bedrock_claude`).

The members are botocore's bedrock-runtime service model's (``botocore/data/bedrock-runtime/2023-09-30/
service-2.json``, ``ConverseRequest``): ``inferenceConfig`` (``maxTokens``, ``temperature`` 0 to 1, ``topP``,
``stopSequences``) and ``outputConfig``:

- ``textFormat``: a stage's schema (``response_format`` of type ``json_schema``) as ``{"type": "json_schema",
  "structure": {"jsonSchema": {"schema": <the schema as a JSON string>, "name": ...}}}`` (``OutputFormat``, its
  ``structure`` a union of one ``JsonSchemaDefinition`` whose ``schema`` is a String). Which models take it is the
  capability table's Converse rules (Amazon Bedrock's structured outputs page); JSON without a schema has no form
  here (``OutputFormatType`` is ``json_schema`` alone).
- ``effort``: ``reasoning.effort`` (``OutputConfigEffortString``; its documentation names low, medium, high, xhigh
  and max), sent where the model's rule takes efforts. A thinking budget has no member in Converse.

What Converse cannot carry (a seed, logprobs, penalties, a budget, JSON mode, an effort it has no word for) is refused
before anything is sent, in one sentence; ``runner validate`` refuses the same by the capability table first.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from runner.errors import BadRequest, ModelSetupError, Refused, TransientError

from .base import Completion

#: Converse's stop reasons as the runner's finish reasons (StopReason of botocore's bedrock-runtime model)
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "stop", "max_tokens": "length",
           "model_context_window_exceeded": "length"}
_FILTERED = ("content_filtered", "guardrail_intervened")
#: the runner's parameters Converse has no member for (InferenceConfiguration has maxTokens, temperature, topP and
#: stopSequences only); a model's own fields would go in additionalModelRequestFields, which differ by model
_NOT_CONVERSE = ("seed", "logprobs", "presence_penalty", "frequency_penalty")
#: OutputConfig.effort's values, as the service model documents them
EFFORTS = ("low", "medium", "high", "xhigh", "max")
_SENT = "(no request was sent)"


@functools.cache
def output_members() -> frozenset[str]:
    """The members of Converse's ``outputConfig`` in the installed botocore's service model (none before it had the
    field: an older botocore refuses the request itself)."""
    import botocore.session

    request = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse")
    member = request.input_shape.members.get("outputConfig")
    return frozenset(member.members) if member is not None else frozenset()


def _output_config(model: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``outputConfig`` of the stage's schema and reasoning effort (empty when it asks for neither)."""
    out: dict[str, Any] = {}
    response_format = params.get("response_format")
    if response_format:
        if response_format.get("type") != "json_schema":
            raise BadRequest(f"bedrock:{model} has no JSON mode without a schema through the Converse API: give the "
                             f"stage a schema: {_SENT}")
        spec = response_format.get("json_schema") or {}
        definition = {"schema": json.dumps(spec.get("schema") or {}, ensure_ascii=False, separators=(",", ":"))}
        if spec.get("name"):
            definition["name"] = spec["name"]
        out["textFormat"] = {"type": "json_schema", "structure": {"jsonSchema": definition}}
    reasoning = params.get("reasoning") or {}
    if reasoning.get("budget_tokens") is not None:
        raise BadRequest(f"bedrock:{model} takes no thinking budget through the Converse API: set reasoning.effort "
                         f"instead of budget_tokens {_SENT}")
    effort = reasoning.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise BadRequest(f"bedrock:{model} takes reasoning effort {', '.join(EFFORTS)} through the Converse API, "
                             f"not {effort}: choose one of those for reasoning.effort {_SENT}")
        out["effort"] = effort
    missing = [name for name in out if name not in output_members()]
    if missing:
        import botocore

        raise ModelSetupError(f"bedrock:{model}: the installed botocore {botocore.__version__} has no outputConfig."
                              f"{missing[0]} for Converse: upgrade boto3 (pip install -U boto3), or remove the "
                              f"stage's {'schema:' if missing[0] == 'textFormat' else 'reasoning:'} {_SENT}")
    return out


def converse_request(model: str, messages: list[dict[str, str]], params: Mapping[str, Any]) -> dict[str, Any]:
    """The Converse request of the runner's messages and parameters, as boto3's keyword arguments."""
    given = [name for name in _NOT_CONVERSE if params.get(name)]
    if given:
        raise BadRequest(f"bedrock:{model} takes no {', '.join(given)} through the Converse API: remove "
                         f"params.{given[0]} for this model {_SENT}")
    temperature = params.get("temperature")
    if temperature is not None and not 0 <= temperature <= 1:  # InferenceConfiguration.temperature: 0 to 1
        raise BadRequest(f"bedrock:{model} takes temperature 0 to 1, not {temperature:g}: set params.temperature "
                         f"between 0 and 1 {_SENT}")
    system = [{"text": m["content"]} for m in messages if m.get("role") == "system" and m["content"]]
    turns = [{"role": m["role"], "content": [{"text": m["content"]}]} for m in messages if m.get("role") != "system"]
    config: dict[str, Any] = {}
    for ours, theirs in (("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP"),
                         ("stop", "stopSequences")):
        if params.get(ours) is not None:
            config[theirs] = params[ours]
    request: dict[str, Any] = {"modelId": model, "messages": turns}
    if system:
        request["system"] = system
    if config:
        request["inferenceConfig"] = config
    output = _output_config(model, params)
    if output:
        request["outputConfig"] = output
    return request


def converse_completion(response: Mapping[str, Any], where: str) -> Completion:
    """A Converse response as a :class:`Completion`; a filtered answer (content filter, guardrail) is ``Refused``,
    billed. A body without the members botocore's service model requires of a ConverseResponse that the runner reads
    (``output`` an object, ``stopReason``) is malformed: botocore's parser hands on a body that is not JSON as
    ``{"message": TEXT}``."""
    if not isinstance(response.get("output"), dict) or not response.get("stopReason"):
        raise TransientError(f"{where}: the response was not a Converse answer (no output or stopReason)",
                             error_class="malformed_response")
    blocks = ((response.get("output") or {}).get("message") or {}).get("content") or []
    usage = response.get("usage") or {}
    cache_read = usage.get("cacheReadInputTokens") or 0
    cache_write = usage.get("cacheWriteInputTokens") or 0
    thoughts = [((b.get("reasoningContent") or {}).get("reasoningText") or {}).get("text") for b in blocks]
    thoughts = [t for t in thoughts if t]
    stop = response.get("stopReason")
    completion = Completion(
        text="".join(b["text"] for b in blocks if isinstance(b.get("text"), str)),
        finish_reason=_FINISH.get(stop, stop),
        # Converse counts cached input apart (like Anthropic); the runner's input_tokens is all input
        input_tokens=(usage.get("inputTokens") or 0) + cache_read + cache_write,
        output_tokens=usage.get("outputTokens") or 0,
        cached_tokens=cache_read,
        cache_write_tokens=cache_write,
        raw={key: value for key, value in response.items() if key != "ResponseMetadata"},
        thinking="\n\n".join(thoughts) if thoughts else None,
    )
    if stop in _FILTERED:
        raise Refused(f"{where}: the answer was withheld (stopReason {stop})", billed=completion)
    return completion
