"""Strict mode's rules for OpenAI Chat Completions (``POST /v1/chat/completions``); :func:`refusal` is called by
:func:`simserver.strict.refusal`.

The body must validate against ``CreateChatCompletionRequest`` of OpenAI's published OpenAPI document
(``published/openai_chat_request.json``, extracted by ``scripts/extract_published.py``; OpenAPI's
``nullable`` is translated here). Top-level names the document does not define are refused ("Unrecognized
request argument supplied"). The json_schema response format's ``name`` rule is in the document's prose
("Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64"). The rules per
model are this server's own (:func:`simserver.model_rules.facts`, each rule with its source; a fact no rule
states is not checked): reasoning models take no temperature or top_p but their default 1, no ``max_tokens``,
no penalties, no logprobs and (where their rule says so) no ``stop``; ``reasoning_effort`` only on reasoning
models and only the levels they take; ``max_completion_tokens`` up to the model's output limit.
"""

from __future__ import annotations

import collections.abc
import functools
import json
import re
from typing import Any

from .model_rules import Facts, facts
from .refusals import Refusal, published


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**53:
        return str(int(value))
    return json.dumps(value)


def _shown(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else json.dumps(value)


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


def _openai_schema() -> dict[str, Any]:
    extract = published("openai_chat_request.json")
    schemas = {name: _nullable(schema) for name, schema in extract["schemas"].items()}
    return {"$ref": f"#/components/schemas/{extract['root']}", "components": {"schemas": schemas}}


@functools.cache
def _openai_validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(_openai_schema())


@functools.cache
def _openai_fast_check() -> Any:
    """jsonschema-rs's validator of the same schema, or None where it is not installed: a body it finds valid is
    not checked again (0.002 ms against jsonschema's 0.9 ms, two thirds of this server's CPU per request); one it
    does not is checked by jsonschema, whose error the refusal's words come from. So it can only make a valid body
    cheaper, never change an answer, as long as it is no more lenient than jsonschema (formats are not checked by
    either: tests/simserver/test_sim_strict.py compares the two on valid and invalid bodies)."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    try:
        return jsonschema_rs.Draft202012Validator(_openai_schema(), validate_formats=False)
    except ValueError:  # before 0.40 it could not hold the document's 64-bit bounds: every body to jsonschema
        return None


def _valid_at_once(body: dict[str, Any]) -> bool:
    fast = _openai_fast_check()
    if fast is None:
        return False
    try:
        return bool(fast.is_valid(body))
    except (ValueError, OverflowError):  # a number it cannot hold: jsonschema decides
        return False


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
    extract = published("openai_chat_request.json")
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


def refusal(body: dict[str, Any], model: str, path: str) -> Refusal | None:
    names = _openai_names()
    unknown = next((name for name in body if name not in names), None)
    if unknown is not None:
        return Refusal(f"Unrecognized request argument supplied: {unknown}", None, None)
    if not _valid_at_once(body):
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
    return _openai_model(body, facts("openai", model))


def _unsupported(name: str, extra: str = "") -> Refusal:
    return Refusal(f"Unsupported parameter: '{name}' is not supported with this model.{extra}", name,
                   "unsupported_parameter")


def _openai_model(body: dict[str, Any], model: Facts) -> Refusal | None:
    reasons = model.get("reasoning") in ("optional", "default", "always")
    takes = {"temperature": model.get("temperature", ()) is not None, "top_p": model.get("top_p", True)}
    for name, allowed in takes.items():
        value = body.get(name)
        if value is not None and not allowed and value != 1:
            return Refusal(f"Unsupported value: '{name}' does not support {_number(value)} with this model. Only the "
                           "default (1) value is supported.", name, "unsupported_value")
    if reasons and body.get("max_tokens") is not None:
        return _unsupported("max_tokens", " Use 'max_completion_tokens' instead.")
    # the reasoning models take no penalties but their default 0 (OpenAI's reasoning guide, its list of the
    # parameters they do not support)
    for name in ("presence_penalty", "frequency_penalty"):
        if not model.get("penalties", True) and body.get(name) not in (None, 0):
            return _unsupported(name)
    if not model.get("logprobs", True):
        for name in ("logprobs", "top_logprobs"):
            if body.get(name) not in (None, False):
                return _unsupported(name)
    if model.get("max_stop") == 0 and body.get("stop"):
        return _unsupported("stop")
    effort = body.get("reasoning_effort")
    if effort is not None:
        efforts = model.get("efforts")
        if model.get("reasoning") == "never" or efforts == ():
            return _unsupported("reasoning_effort")
        if efforts and effort not in efforts:
            shown = ", ".join(f"'{e}'" for e in efforts[:-1]) + f", and '{efforts[-1]}'" if len(efforts) > 1 \
                else f"'{efforts[0]}'"
            return Refusal(f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
                           f"Supported values are: {shown}.", "reasoning_effort", "unsupported_value")
    kind = (body.get("response_format") or {}).get("type")
    if (kind == "json_schema" and not model.get("schema", True)) or \
            (kind == "json_object" and not model.get("json_mode", True)):
        return Refusal(f"Invalid parameter: 'response_format' of type '{kind}' is not supported with this model.",
                       "response_format", None)
    seed, bounds = body.get("seed"), model.get("seed")
    if bounds is not None and isinstance(seed, int) and not bounds[0] <= seed <= bounds[1]:
        return Refusal(f"Invalid 'seed': integer out of range. Expected a value between {bounds[0]} and "
                       f"{bounds[1]}, but got {seed} instead.", "seed", "integer_out_of_range")
    limit = model.get("max_output")
    for name in ("max_completion_tokens", "max_tokens"):
        cap = body.get(name)
        if isinstance(cap, int) and limit and cap > limit:
            return Refusal(f"max_tokens is too large: {cap}. This model supports at most {limit} "
                           f"completion tokens, whereas you provided {cap}.", name, "invalid_value")
    return None
