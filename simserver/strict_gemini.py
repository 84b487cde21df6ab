"""Strict mode's rules for Gemini generateContent (``POST /{v1,v1beta}/models/{model}:generateContent``);
:func:`refusal` is called by :func:`simserver.strict.refusal`.

Field names per message and API version come from the published protos (googleapis/googleapis
``google/ai/generativelanguage/{v1,v1beta}/*.proto``, extracted to ``published/gemini_fields.json``): v1 has
no ``systemInstruction`` and its GenerationConfig no ``responseMimeType``, ``responseSchema`` or
``thinkingConfig``. Scalar types (``seed`` int32) and enum values come from the same files. The protos lag
the API in two places the runner uses: ``ThinkingConfig.thinkingLevel`` (Gemini 3), taken from the
google-genai SDK's ``types.ThinkingConfig``/``types.ThinkingLevel``, and ``GenerateContentRequest.serviceTier``
(the inference tiers), taken from the SDK's ``types.GenerateContentConfig.service_tier``/``types.ServiceTier``
(whose lower-case values it sends) and the protos' enum naming. Value rules: this server's own
(:func:`simserver.model_rules.facts`, each with its source: at most 5 stop sequences, temperature 0-2, penalties,
thinking budget ranges and levels, thinking that cannot be turned off; the tiers a model is sold at are checked
by :mod:`simserver.tiers`).
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from .model_rules import facts
from .refusals import Refusal, is_number, published

#: fields the published protos lag behind, taken from the google-genai SDK's types (see the module docstring):
#: (API version, message) -> JSON name -> field
_GEMINI_SUPPLEMENT = {
    ("v1beta", "ThinkingConfig"): {"thinkingLevel": {"name": "thinking_level", "type": "ThinkingLevel",
                                                     "repeated": False}},
    ("v1beta", "GenerateContentRequest"): {"serviceTier": {"name": "service_tier", "type": "ServiceTier",
                                                           "repeated": False}},
}
_SDK_ENUMS = {"ThinkingLevel": ["THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH", "XHIGH"],
              # google-genai 3.6.1 types.ServiceTier's values, and the same in the protos' enum style
              "ServiceTier": ["unspecified", "standard", "flex", "priority", "SERVICE_TIER_UNSPECIFIED",
                              "SERVICE_TIER_STANDARD", "SERVICE_TIER_FLEX", "SERVICE_TIER_PRIORITY"]}
_INT32 = (-(2**31), 2**31 - 1)
_INTS = {"int32": _INT32, "sint32": _INT32, "sfixed32": _INT32, "uint32": (0, 2**32 - 1), "fixed32": (0, 2**32 - 1),
         "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}



def _field(name: str, type_: str, repeated: bool = False) -> dict[str, Any]:
    return {"name": name, "type": type_, "repeated": repeated}


#: the body of cachedContents.create, which the extract (generative_service, content, safety) does not reach: the
#: fields of v1beta's CachedContent as the REST reference lists them (ai.google.dev/api/caching#CachedContent);
#: output-only fields (name, createTime, updateTime, usageMetadata) are taken and ignored, as Google's APIs do
_CACHED_CONTENT = {
    "expireTime": _field("expire_time", "google.protobuf.Timestamp"), "ttl": _field("ttl", "google.protobuf.Duration"),
    "name": _field("name", "string"), "displayName": _field("display_name", "string"),
    "model": _field("model", "string"), "systemInstruction": _field("system_instruction", "Content"),
    "contents": _field("contents", "Content", True), "tools": _field("tools", "Tool", True),
    "toolConfig": _field("tool_config", "ToolConfig"), "createTime": _field("create_time", "google.protobuf.Timestamp"),
    "updateTime": _field("update_time", "google.protobuf.Timestamp"),
    "usageMetadata": _field("usage_metadata", "google.protobuf.Value"),
}


@functools.cache
def _gemini_fields(version: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """(message -> field lookup by JSON name and by proto name, enum -> values) for one API version."""
    extract = published("gemini_fields.json")[version]
    messages: dict[str, dict[str, Any]] = {}
    extra = {"CachedContent": _CACHED_CONTENT} if version == "v1beta" else {}
    for name, fields in {**extract["messages"], **extra}.items():
        fields = {**fields, **_GEMINI_SUPPLEMENT.get((version, name), {})}
        messages[name] = {**{f["name"]: f for f in fields.values()}, **fields}
    return messages, {**extract["enums"], **_SDK_ENUMS}


def _gemini_invalid(where: str, type_: str, value: Any) -> Refusal:
    return Refusal(f"Invalid JSON payload received. Invalid value at '{where}' ({type_}), {json.dumps(value)}")


def _gemini_walk(value: Any, message: str, where: str, version: str) -> Refusal | None:
    messages, enums = _gemini_fields(version)
    fields = messages[message]
    if not isinstance(value, dict):
        return Refusal(f"Invalid JSON payload received. Expected an object at '{where}'.")
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            at = f" at '{where}'" if where else ""
            return Refusal(f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.')
        inner = f"{where}.{field['name']}" if where else field["name"]
        items = item if field["repeated"] else [item]
        if field["repeated"] and not isinstance(item, list):
            return Refusal(f"Invalid JSON payload received. Expected an array at '{inner}'.")
        for i, element in enumerate(items):
            at = f"{inner}[{i}]" if field["repeated"] else inner
            if (refused := _gemini_value(element, field["type"], at, version, messages, enums)) is not None:
                return refused
    return None


def _gemini_value(value: Any, type_: str, where: str, version: str, messages: dict[str, Any],
                  enums: dict[str, list[str]]) -> Refusal | None:
    if value is None:
        return None
    if type_ in messages:
        return _gemini_walk(value, type_, where, version)
    if type_ in enums:
        if value not in enums[type_]:
            return _gemini_invalid(where, f"type.googleapis.com/google.ai.generativelanguage.{version}.{type_}",
                                   value)
        return None
    if type_ in _INTS:
        low, high = _INTS[type_]
        number = value
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            number = int(value)
        if not is_number(number) or number != math.floor(number) or not low <= number <= high:
            return _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
        return None
    if type_ in ("float", "double"):
        return None if is_number(value) else _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
    if type_ == "bool":
        return None if isinstance(value, bool) else _gemini_invalid(where, "TYPE_BOOL", value)
    if type_ in ("string", "bytes"):
        return None if isinstance(value, str) else _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
    return None  # google.protobuf.Value / Struct / Duration and the like: any JSON


def refusal(body: dict[str, Any], model: str, version: str) -> Refusal | None:
    refused = _gemini_walk(body, "GenerateContentRequest", "", version)
    if refused is not None:
        return refused
    rules = facts("gemini", model)
    config = body.get("generationConfig", body.get("generation_config")) or {}

    def option(camel: str, snake: str) -> Any:
        return config.get(camel, config.get(snake))

    stop, max_stop = option("stopSequences", "stop_sequences") or [], rules.get("max_stop")
    if max_stop is not None and len(stop) > max_stop:
        return Refusal(f"* GenerateContentRequest.generation_config.stop_sequences: the number of stop_sequences "
                       f"must be at most {max_stop}, got {len(stop)}.\n")
    temperature, allowed = config.get("temperature"), rules.get("temperature")
    if temperature is not None and allowed is not None and not allowed[0] <= temperature <= allowed[1]:
        return Refusal(f"Unable to submit request because it has a temperature value of {temperature:g} but the "
                       f"supported range is from {allowed[0]:g} (inclusive) to "
                       f"{allowed[1] + 0.0001:g} (exclusive). Update the value and try again.")
    # a model without penalties refuses any but 0, which is taken as unset (the API's answer to Gemini 2.5 models,
    # reported in vercel/ai#8943 and google-gemini/cookbook#1290)
    for camel, snake in (("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
        if rules.get("penalties") is False and option(camel, snake) not in (None, 0):
            return Refusal(f"Penalty is not enabled for models/{model}")
    top_p = option("topP", "top_p")
    if top_p is not None and not 0 <= top_p <= 1:
        return Refusal(f"Unable to submit request because it has a topP value of {top_p:g} but the supported range "
                       "is from 0 (inclusive) to 1.0001 (exclusive). Update the value and try again.")
    thinking = option("thinkingConfig", "thinking_config") or {}
    budget = thinking.get("thinkingBudget", thinking.get("thinking_budget"))
    level = thinking.get("thinkingLevel", thinking.get("thinking_level"))
    reasoning, bounds = rules.get("reasoning"), rules.get("budget")
    if budget is not None and budget != -1:  # -1: dynamic thinking
        if budget == 0 and reasoning == "always":
            return Refusal("Budget 0 is invalid. This model only works in thinking mode.")
        if budget != 0 and bounds is not None and not bounds[0] <= budget <= bounds[1]:
            return Refusal(f"The thinking budget {budget} is invalid. Please choose a value between "
                           f"{bounds[0]} and {bounds[1]}.")
        if budget != 0 and reasoning == "never":
            return Refusal(f"Thinking is not supported for models/{model}.")
    efforts = rules.get("efforts")
    if level is not None and level != "THINKING_LEVEL_UNSPECIFIED" and efforts is not None:
        if not efforts:
            return Refusal(f"Thinking level is not supported for models/{model}.")
        if str(level).lower() not in efforts:
            return Refusal(f"Thinking level {level} is not supported for models/{model}; supported levels are "
                           f"{', '.join(e.upper() for e in efforts)}.")
    return None


def cached_content_refusal(body: dict[str, Any]) -> Refusal | None:
    """The refusal of a cachedContents.create body (v1beta) whose fields or values the API does not take."""
    return _gemini_walk(body, "CachedContent", "", "v1beta")


def count_refusal(body: dict[str, Any], message: str = "CountTokensRequest") -> Refusal | None:
    """The refusal of a countTokens body (v1beta): a ``CountTokensRequest`` of the Gemini API, or the
    ``GenerateContentRequest`` fields Vertex's countTokens takes beside its contents."""
    return _gemini_walk(body, message, "", "v1beta")
