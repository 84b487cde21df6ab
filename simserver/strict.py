"""Strict mode: refuse what the real APIs refuse, with their status and error body (``SimConfig.strict``).

:func:`refusal` is called on every body the format module has parsed (online, and on every batch line). It
returns None for a body the real API takes, or a :class:`Refusal` (status 400, message, and for OpenAI the
``param`` and ``code``) that :func:`render` turns into the format's own error body.

Where each rule comes from (never from this project's own idea of the API):

OpenAI Chat Completions (``POST /v1/chat/completions``)
    The body must validate against ``CreateChatCompletionRequest`` of OpenAI's published OpenAPI document
    (``published/openai_chat_request.json``, extracted by ``scripts/extract_published.py``; OpenAPI's
    ``nullable`` is translated here). Top-level names the document does not define are refused ("Unrecognized
    request argument supplied"). The json_schema response format's ``name`` rule is in the document's prose
    ("Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64"). The rules per
    model are the capability table's (:func:`runner.providers.capabilities.capabilities`, each rule with its
    source): reasoning models take no temperature or top_p but their default 1, no ``max_tokens``, no logprobs
    and (where the table says so) no ``stop``; ``reasoning_effort`` only on reasoning models and only the
    levels they take; ``max_completion_tokens`` up to the model's output limit.
Anthropic Messages (``POST /v1/messages``)
    The ``anthropic-version`` header decides. The body's structure is the anthropic SDK's own request type
    (``anthropic.types.message_create_params.MessageCreateParamsBase`` and the TypedDicts it names); SDK 2.x
    types no longer name ``temperature``, ``top_p`` or ``top_k``, as version 2026-10-21 refuses them, so those
    three are taken only under 2023-06-01. Unknown fields: "<field>: Extra inputs are not permitted". The rules
    per model come from the capability table (temperature range, temperature with top_p, sampling refused on
    Claude Opus 4.7+, Sonnet 5+, Fable, Mythos, thinking forms and budgets, structured outputs, output limit).
Gemini generateContent (``POST /{v1,v1beta}/models/{model}:generateContent``)
    Field names per message and API version come from the published protos (googleapis/googleapis
    ``google/ai/generativelanguage/{v1,v1beta}/*.proto``, extracted to ``published/gemini_fields.json``): v1 has
    no ``systemInstruction`` and its GenerationConfig no ``responseMimeType``, ``responseSchema`` or
    ``thinkingConfig``. Scalar types (``seed`` int32) and enum values come from the same files. The protos lag
    the API in one place the runner uses: ``ThinkingConfig.thinkingLevel`` (Gemini 3), taken from the
    google-genai SDK's ``types.ThinkingConfig``/``types.ThinkingLevel``. Value rules: the capability table
    (at most 5 stop sequences, temperature 0-2, thinking budget ranges, thinking that cannot be turned off).
"""

from __future__ import annotations

import collections.abc
import functools
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from aiohttp import web
from typing_extensions import is_typeddict

from runner.providers.capabilities import ANTHROPIC_VERSIONS, ModelCaps, capabilities

from .openai import OpenAIFormat
from .wire import WireFormat

__all__ = ["Refusal", "refusal", "render"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the real API would refuse a body: what the format's error body carries."""

    message: str
    param: str | None = None
    code: str | None = None  #: OpenAI's error code (unsupported_parameter, unsupported_value, invalid_value...)
    status: int = 400


def render(fmt: WireFormat, refused: Refusal, headers: dict[str, str]) -> web.Response:
    """The format's error response for a refusal (OpenAI's carries ``param`` and ``code``)."""
    if fmt.name == "openai":
        return OpenAIFormat.error(refused.status, refused.message, "invalid_request_error", refused.code, headers,
                                  refused.param)
    return fmt.bad_request(refused.message, refused.param, headers)


def refusal(wire: str, body: Any, *, model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """The refusal the real API gives this body, or None when it takes it. ``wire`` is the format's name,
    ``headers`` the request's (Anthropic reads ``anthropic-version``), ``path`` the URL path (OpenAI: only
    ``/v1/chat/completions`` is checked; Gemini: ``/v1/`` or ``/v1beta/``)."""
    if not isinstance(body, dict):
        return None  # the format module has answered it already
    if wire == "openai":
        return _openai(body, model, path) if path.endswith("/chat/completions") else None
    if wire == "anthropic":
        return _anthropic(body, model, headers)
    if wire == "gemini":
        return _gemini(body, model, "v1" if path.startswith("/v1/") else "v1beta")
    return None


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**53:
        return str(int(value))
    return json.dumps(value)


def _shown(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else json.dumps(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# == OpenAI ================================================================================================

def _published(name: str) -> dict[str, Any]:
    return json.loads(files("simserver").joinpath("published", name).read_text())


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` as JSON Schema: the type widened by null (or the schema or'ed with it)."""
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: (value if key in ("enum", "const", "default") else
                 {k: _nullable(v) for k, v in value.items()} if key in ("properties", "patternProperties")
                 else _nullable(value)) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        if isinstance(out.get("type"), str) and "$ref" not in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


@functools.cache
def _openai_validator() -> Any:
    import jsonschema

    extract = _published("openai_chat_request.json")
    schemas = {name: _nullable(schema) for name, schema in extract["schemas"].items()}
    root = {"$ref": f"#/components/schemas/{extract['root']}", "components": {"schemas": schemas}}
    return jsonschema.Draft202012Validator(root)


def _properties(schema: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    """The property names a schema defines, through allOf and $ref."""
    names = set(schema.get("properties") or {})
    for part in schema.get("allOf") or ():
        if "$ref" in part:
            part = schemas[part["$ref"].rsplit("/", 1)[-1]]
        names |= _properties(part, schemas)
    return names


@functools.cache
def _openai_names() -> frozenset[str]:
    extract = _published("openai_chat_request.json")
    return frozenset(_properties(extract["schemas"][extract["root"]], extract["schemas"]))


def _param(path: collections.abc.Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_error(error: Any) -> Refusal:
    """A jsonschema error in OpenAI's words (their 400s name the parameter, what was expected and what came)."""
    while error.context:  # a oneOf/anyOf: the alternative meant (by its type and its role/type tag)
        arms: dict[Any, list[Any]] = {}
        for e in error.context:
            arms.setdefault(e.schema_path[0] if e.schema_path else None, []).append(e)
        tags = {arm: [e for e in errs if e.validator in ("enum", "const") and list(e.relative_path) in (["role"],
                                                                                                     ["type"])]
                for arm, errs in arms.items()}
        if arms and all(tags.values()):  # no alternative takes this tag: say which ones there are
            first = next(iter(tags.values()))[0]
            allowed = [v for errs in tags.values() for e in errs
                       for v in (e.validator_value if e.validator == "enum" else [e.validator_value])]
            shown = ", ".join(f"'{v}'" for v in dict.fromkeys(allowed))
            return Refusal(f"Invalid value: {_shown(first.instance)}. Supported values are: {shown}.",
                           _param(first.absolute_path), "invalid_value")
        meant = [e for arm, errs in arms.items() if not tags[arm] for e in errs
                 if not (e.validator == "type" and not e.relative_path)]
        import jsonschema.exceptions

        error = jsonschema.exceptions.best_match(meant or error.context)
        if error.validator not in ("oneOf", "anyOf"):
            break
    param = _param(error.absolute_path) or None
    value, kind, limit = error.instance, error.validator, error.validator_value
    where = f"'{param}'" if param else "the request body"
    if kind == "maxItems":
        return Refusal(f"Invalid {where}: array too long. Expected an array with maximum length {limit}, but got "
                       f"an array with length {len(value)} instead.", param, "array_above_max_length")
    if kind == "minItems":
        return Refusal(f"Invalid {where}: empty array. Expected an array with minimum length {limit}, but got an "
                       f"empty array instead." if not value else
                       f"Invalid {where}: array too short. Expected an array with minimum length {limit}, but got an "
                       f"array with length {len(value)} instead.", param,
                       "empty_array" if not value else "array_below_min_length")
    if kind in ("maximum", "minimum"):
        what = "integer" if isinstance(value, int) else "decimal"
        side, sign, code = ("above maximum", "<=", "above_max") if kind == "maximum" else \
            ("below minimum", ">=", "below_min")
        return Refusal(f"Invalid {where}: {what} {side} value. Expected a value {sign} {_number(limit)}, but got "
                       f"{_number(value)} instead.", param, f"{what}_{code}_value")
    if kind in ("maxLength", "minLength"):
        return Refusal(f"Invalid {where}: string too {'long' if kind == 'maxLength' else 'short'}. Expected a string "
                       f"with {'maximum' if kind == 'maxLength' else 'minimum'} length {limit}, but got a string "
                       f"with length {len(value)} instead.", param,
                       "string_above_max_length" if kind == "maxLength" else "string_below_min_length")
    if kind == "enum":
        shown = ", ".join(f"'{v}'" for v in limit if v is not None)
        return Refusal(f"Invalid value: {_shown(value)}. Supported values are: {shown}.", param, "invalid_value")
    if kind == "type":
        got = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string", list: "an array",
               dict: "an object", type(None): "null"}.get(type(value), "a value")
        wanted = limit if isinstance(limit, str) else " or ".join(t for t in limit if t != "null")
        return Refusal(f"Invalid type for {where}: expected {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}, but "
                       f"got {got} instead.", param, "invalid_type")
    if kind == "required":
        missing = next((name for name in limit if name not in value), limit[0])
        full = f"{param}.{missing}" if param else missing
        return Refusal(f"Missing required parameter: '{full}'.", full, "missing_required_parameter")
    if kind == "pattern":
        return Refusal(f"Invalid {where}: string does not match pattern. Expected a string that matches the pattern "
                       f"'{limit}'.", param, "invalid_value")
    if kind == "additionalProperties":
        extra = re.findall(r"'([^']+)'", error.message)
        name = f"{param}.{extra[0]}" if param and extra else (extra[0] if extra else param)
        return Refusal(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    return Refusal(f"Invalid value for {where}.", param, "invalid_value")


#: ResponseFormatJsonSchema.json_schema.name, in the document's prose: "Must be a-z, A-Z, 0-9, or contain
#: underscores and dashes, with a maximum length of 64."
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _openai(body: dict[str, Any], model: str, path: str) -> Refusal | None:
    names = _openai_names()
    unknown = next((name for name in body if name not in names), None)
    if unknown is not None:
        return Refusal(f"Unrecognized request argument supplied: {unknown}", None, None)
    validator = _openai_validator()
    error = next(iter(sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))), None)
    if error is not None:
        return _schema_error(error)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        name = (response_format.get("json_schema") or {}).get("name")
        if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
            return Refusal("Invalid 'response_format.json_schema.name': string does not match pattern. Expected a "
                           "string that matches the pattern '^[a-zA-Z0-9_-]+$'.", "response_format.json_schema.name",
                           "invalid_value")
    caps = capabilities("openai", model)
    return _openai_model(body, caps) if caps is not None else None


def _unsupported(name: str, extra: str = "") -> Refusal:
    return Refusal(f"Unsupported parameter: '{name}' is not supported with this model.{extra}", name,
                   "unsupported_parameter")


def _openai_model(body: dict[str, Any], caps: ModelCaps) -> Refusal | None:
    reasons = caps.reasoning != "never"
    for name, allowed in (("temperature", caps.temperature is not None), ("top_p", caps.top_p)):
        value = body.get(name)
        if value is not None and not allowed and value != 1:
            return Refusal(f"Unsupported value: '{name}' does not support {_number(value)} with this model. Only the "
                           "default (1) value is supported.", name, "unsupported_value")
    if reasons and body.get("max_tokens") is not None:
        return _unsupported("max_tokens", " Use 'max_completion_tokens' instead.")
    if not caps.logprobs:
        for name in ("logprobs", "top_logprobs"):
            if body.get(name) not in (None, False):
                return _unsupported(name)
    if caps.max_stop == 0 and body.get("stop"):
        return _unsupported("stop")
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not reasons:
            return _unsupported("reasoning_effort")
        if caps.efforts and effort not in caps.efforts:
            shown = ", ".join(f"'{e}'" for e in caps.efforts[:-1]) + f", and '{caps.efforts[-1]}'"
            return Refusal(f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
                           f"Supported values are: {shown}.", "reasoning_effort", "unsupported_value")
    kind = (body.get("response_format") or {}).get("type")
    if (kind == "json_schema" and not caps.schema) or (kind == "json_object" and not caps.json_mode):
        return Refusal(f"Invalid parameter: 'response_format' of type '{kind}' is not supported with this model.",
                       "response_format", None)
    seed = body.get("seed")
    if caps.seed is not None and isinstance(seed, int) and not caps.seed[0] <= seed <= caps.seed[1]:
        return Refusal(f"Invalid 'seed': integer out of range. Expected a value between {caps.seed[0]} and "
                       f"{caps.seed[1]}, but got {seed} instead.", "seed", "integer_out_of_range")
    for name in ("max_completion_tokens", "max_tokens"):
        cap = body.get(name)
        if isinstance(cap, int) and caps.max_output and cap > caps.max_output:
            return Refusal(f"max_tokens is too large: {cap}. This model supports at most {caps.max_output} "
                           f"completion tokens, whereas you provided {cap}.", name, "invalid_value")
    return None


# == Anthropic =============================================================================================

#: the sampling fields API version 2023-06-01 takes (Messages API reference of that version) and the SDK 2.x
#: request types no longer name, as 2026-10-21 refuses them
_SAMPLING = ("temperature", "top_p", "top_k")


@functools.cache
def _hints(tp: Any) -> dict[str, Any]:
    return typing.get_type_hints(tp)


@functools.cache
def _anthropic_fields() -> dict[str, Any]:
    from anthropic.types import message_create_params

    fields = dict(_hints(message_create_params.MessageCreateParamsBase))
    fields["stream"] = bool  # MessageCreateParamsNonStreaming / Streaming add it
    return fields


def _tag(value: Any) -> str | None:
    """The key that tells a union's dictionaries apart: "type" (blocks, tools, thinking) or "role" (messages)."""
    return next((key for key in ("type", "role") if isinstance(value, dict) and key in value), None)


def _tagged(value: Any, tp: Any) -> bool | None:
    """Whether ``value``'s tag is one the TypedDict ``tp`` takes (None when either has no tag)."""
    key = _tag(value)
    if key is None or not is_typeddict(tp):
        return None
    tag = _hints(tp).get(key)
    if typing.get_origin(tag) is typing.Literal:
        return value[key] in typing.get_args(tag)
    return None


def _conform(value: Any, tp: Any, where: str) -> str | None:
    """Why ``value`` does not fit the SDK type ``tp`` (pydantic's words, as the Messages API answers), or None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return None
    if origin in (typing.Required, typing.NotRequired, typing.Annotated):
        return _conform(value, args[0], where)
    if tp is type(None):
        return None if value is None else f"{where}: Input should be None"
    if origin in (typing.Union, types.UnionType):
        tagged = [arm for arm in args if _tagged(value, arm)]
        if (key := _tag(value)) and any(_tagged(value, arm) is False for arm in args) and not tagged:
            return f"{where}.{key}: Input tag '{value[key]}' found using '{key}' does not match any of the " \
                   "expected tags"
        problems = [_conform(value, arm, where) for arm in (tagged or args)]
        if any(p is None for p in problems):
            return None
        return max(problems, key=lambda p: len(p.split(":", 1)[0]))  # type: ignore[union-attr]  # the deepest
    if origin is typing.Literal:
        if value in args:
            return None
        shown = " or ".join(repr(a) for a in args) if len(args) < 6 else "one of the allowed values"
        return f"{where}: Input should be {shown}"
    if tp is str:
        return None if isinstance(value, str) else f"{where}: Input should be a valid string"
    if tp is bool:
        return None if isinstance(value, bool) else f"{where}: Input should be a valid boolean"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else \
            f"{where}: Input should be a valid integer"
    if tp is float:
        return None if _is_number(value) else f"{where}: Input should be a valid number"
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence):
        if not isinstance(value, list):
            return f"{where}: Input should be a valid list"
        for i, item in enumerate(value):
            if (problem := _conform(item, args[0] if args else Any, f"{where}.{i}")) is not None:
                return problem
        return None
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return f"{where}: Input should be a valid dictionary or object"
        hints = _hints(tp)
        for key, item in value.items():
            if key not in hints:
                return f"{where}.{key}: Extra inputs are not permitted"
            if (problem := _conform(item, hints[key], f"{where}.{key}")) is not None:
                return problem
        missing = next((key for key in tp.__required_keys__ if key not in value), None)
        return f"{where}.{missing}: Field required" if missing is not None else None
    if origin in (dict, collections.abc.Mapping) or tp in (dict, typing.Dict):  # noqa: UP006
        return None if isinstance(value, dict) else f"{where}: Input should be a valid dictionary"
    if isinstance(tp, type) and hasattr(tp, "model_fields"):  # a response model (the SDK takes its objects back):
        return f"{where}: Input should be a valid dictionary or object"  # the TypedDict beside it says the shape
    return None  # a type this check does not know: taken


def _anthropic(body: dict[str, Any], model: str, headers: Mapping[str, str]) -> Refusal | None:
    version = headers.get("anthropic-version")
    if not version:
        return Refusal("anthropic-version: header is required")
    if version not in ANTHROPIC_VERSIONS:
        return Refusal(f"anthropic-version: invalid version {version!r}; known versions are "
                       f"{', '.join(ANTHROPIC_VERSIONS)}")
    fields = _anthropic_fields()
    sampling = _SAMPLING if version < "2026-10-21" else ()
    for key, value in body.items():
        if key in sampling:
            if value is not None and not _is_number(value):
                return Refusal(f"{key}: Input should be a valid number")
            continue
        if key not in fields:
            return Refusal(f"{key}: Extra inputs are not permitted")
        if key != "model" and (problem := _conform(value, fields[key], key)) is not None:
            return Refusal(problem)
    caps = capabilities("anthropic", model, version)
    return _anthropic_model(body, caps) if caps is not None else None


_THINKING_DOC = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


def _anthropic_model(body: dict[str, Any], caps: ModelCaps) -> Refusal | None:
    temperature, top_p, top_k = (body.get(name) for name in _SAMPLING)
    if caps.temperature is None:  # Claude Opus 4.7+, Sonnet 5+, Fable, Mythos: no sampling parameter at all
        for name, value in zip(_SAMPLING, (temperature, top_p, top_k), strict=True):
            if value is not None:
                return Refusal(f"`{name}` is not supported for this model.")
    elif temperature is not None and not caps.temperature[0] <= temperature <= caps.temperature[1]:
        side = "less" if temperature > caps.temperature[1] else "greater"
        bound = caps.temperature[1] if side == "less" else caps.temperature[0]
        return Refusal(f"temperature: Input should be {side} than or equal to {bound:g}")
    if top_p is not None and not 0 <= top_p <= 1:
        return Refusal(f"top_p: Input should be {'less' if top_p > 1 else 'greater'} than or equal to "
                       f"{1 if top_p > 1 else 0}")
    if temperature is not None and top_p is not None and not caps.temperature_with_top_p:
        return Refusal("`temperature` and `top_p` cannot both be specified for this model. Please use only one.")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and caps.max_output and max_tokens > caps.max_output:
        return Refusal(f"max_tokens: {max_tokens} > {caps.max_output}, which is the maximum allowed number of "
                       f"output tokens for {caps.model}")
    thinking = body.get("thinking") or {}
    kind = thinking.get("type")
    if kind == "enabled":
        if caps.reasoning == "never":
            return Refusal(f"'{caps.model}' does not support thinking.")
        if caps.budget is None:
            return Refusal("thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and "
                           "output_config.effort to control thinking behavior.")
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget < 1024:
            return Refusal("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if isinstance(budget, int) and isinstance(max_tokens, int) and budget >= max_tokens:
            return Refusal("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                           f"documentation at {_THINKING_DOC}#max-tokens-and-context-window-size")
    elif kind == "adaptive" and not caps.efforts:
        return Refusal(f"adaptive thinking is not supported on this model ('{caps.model}'); use thinking.type."
                       "enabled with budget_tokens.")
    if kind in ("enabled", "adaptive"):
        if temperature is not None and temperature != 1:
            return Refusal("`temperature` may only be set to 1 when thinking is enabled. Please consult our "
                           f"documentation at {_THINKING_DOC}#feature-compatibility")
        if top_k is not None:
            return Refusal("`top_k` is not compatible with thinking. Please consult our documentation at "
                           f"{_THINKING_DOC}#feature-compatibility")
        if top_p is not None and top_p < 0.95:
            return Refusal("`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled. Please "
                           f"consult our documentation at {_THINKING_DOC}#feature-compatibility")
    output_config = body.get("output_config") or {}
    if output_config.get("format") is not None and not caps.schema:
        return Refusal(f"output_config.format: structured outputs are not supported on this model ('{caps.model}')")
    effort = output_config.get("effort")
    if effort is not None:
        if not caps.efforts:
            return Refusal(f"output_config.effort: effort is not supported on this model ('{caps.model}')")
        if effort not in caps.efforts:
            return Refusal(f"output_config.effort: Input should be {' or '.join(repr(e) for e in caps.efforts)}")
    return None


# == Gemini ================================================================================================

#: fields the published protos lag behind, taken from the google-genai SDK's types (see the module docstring):
#: (API version, message) -> JSON name -> field
_GEMINI_SUPPLEMENT = {
    ("v1beta", "ThinkingConfig"): {"thinkingLevel": {"name": "thinking_level", "type": "ThinkingLevel",
                                                     "repeated": False}},
}
_SDK_ENUMS = {"ThinkingLevel": ["THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH", "XHIGH"]}
_INT32 = (-(2**31), 2**31 - 1)
_INTS = {"int32": _INT32, "sint32": _INT32, "sfixed32": _INT32, "uint32": (0, 2**32 - 1), "fixed32": (0, 2**32 - 1),
         "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}


@functools.cache
def _gemini_fields(version: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """(message -> field lookup by JSON name and by proto name, enum -> values) for one API version."""
    extract = _published("gemini_fields.json")[version]
    messages: dict[str, dict[str, Any]] = {}
    for name, fields in extract["messages"].items():
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
        if not _is_number(number) or number != math.floor(number) or not low <= number <= high:
            return _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
        return None
    if type_ in ("float", "double"):
        return None if _is_number(value) else _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
    if type_ == "bool":
        return None if isinstance(value, bool) else _gemini_invalid(where, "TYPE_BOOL", value)
    if type_ in ("string", "bytes"):
        return None if isinstance(value, str) else _gemini_invalid(where, f"TYPE_{type_.upper()}", value)
    return None  # google.protobuf.Value / Struct / Duration and the like: any JSON


def _gemini(body: dict[str, Any], model: str, version: str) -> Refusal | None:
    refused = _gemini_walk(body, "GenerateContentRequest", "", version)
    if refused is not None:
        return refused
    caps = capabilities("gemini", model)
    if caps is None:
        return None
    config = body.get("generationConfig", body.get("generation_config")) or {}

    def option(camel: str, snake: str) -> Any:
        return config.get(camel, config.get(snake))

    stop = option("stopSequences", "stop_sequences") or []
    if caps.max_stop is not None and len(stop) > caps.max_stop:
        return Refusal(f"* GenerateContentRequest.generation_config.stop_sequences: the number of stop_sequences "
                       f"must be at most {caps.max_stop}, got {len(stop)}.\n")
    temperature = config.get("temperature")
    if temperature is not None and caps.temperature is not None and \
            not caps.temperature[0] <= temperature <= caps.temperature[1]:
        return Refusal(f"Unable to submit request because it has a temperature value of {temperature:g} but the "
                       f"supported range is from {caps.temperature[0]:g} (inclusive) to "
                       f"{caps.temperature[1] + 0.0001:g} (exclusive). Update the value and try again.")
    top_p = option("topP", "top_p")
    if top_p is not None and not 0 <= top_p <= 1:
        return Refusal(f"Unable to submit request because it has a topP value of {top_p:g} but the supported range "
                       "is from 0 (inclusive) to 1.0001 (exclusive). Update the value and try again.")
    thinking = option("thinkingConfig", "thinking_config") or {}
    budget = thinking.get("thinkingBudget", thinking.get("thinking_budget"))
    level = thinking.get("thinkingLevel", thinking.get("thinking_level"))
    if budget is not None and budget != -1:  # -1: dynamic thinking
        if budget == 0 and caps.reasoning == "always":
            return Refusal("Budget 0 is invalid. This model only works in thinking mode.")
        if budget != 0 and caps.budget is not None and not caps.budget[0] <= budget <= caps.budget[1]:
            return Refusal(f"The thinking budget {budget} is invalid. Please choose a value between "
                           f"{caps.budget[0]} and {caps.budget[1]}.")
        if budget != 0 and caps.reasoning == "never":
            return Refusal(f"Thinking is not supported for models/{model}.")
    if level is not None and level != "THINKING_LEVEL_UNSPECIFIED":
        if not caps.efforts:
            return Refusal(f"Thinking level is not supported for models/{model}.")
        if str(level).lower() not in caps.efforts:
            return Refusal(f"Thinking level {level} is not supported for models/{model}; supported levels are "
                           f"{', '.join(e.upper() for e in caps.efforts)}.")
    return None
