"""Structured answers (``parse: json``): the answer read as JSON and checked against the stage's JSON Schema.

What is accepted: one JSON value, with surrounding whitespace, or inside one fenced block (```` ```json ````
or a bare ```` ``` ````) that is the whole answer. Nothing else: no prose around it, no JSON picked out of a
longer text, no ``NaN``/``Infinity`` (not JSON). An answer that is not JSON is invalid with the decoder's message
and position; one that breaks the schema (validated with the ``jsonschema`` library, in the draft its ``$schema``
names, 2020-12 by default) is invalid with the first error's message and where in the answer it is.

:func:`field_text` hands one field of the answer object to the stage's ``score_as`` parser as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from runner.evaluate.parse import Parsed, Reason

__all__ = ["INVALID_JSON", "MISSING_FIELD", "SCHEMA_VIOLATION", "field_text", "parse_json"]

#: reason prefixes of an invalid structured answer
INVALID_JSON = "invalid_json"
SCHEMA_VIOLATION = "schema_violation"
MISSING_FIELD = "missing_field"

_FENCE = re.compile(r"\A\s*```(?:json(?![\w-]))?(.*?)```\s*\Z", re.DOTALL | re.IGNORECASE)
#: validators by the schema they check (the stage's schema dict lives as long as the job)
_VALIDATORS: dict[int, tuple[Mapping[str, Any], Any]] = {}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str, schema: Mapping[str, Any] | None = None) -> Parsed:
    """The answer as a JSON value, checked against ``schema`` when given; invalid with a reason saying why."""
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    if not body.strip():
        return Parsed(None, Reason.EMPTY)
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return Parsed(None, f"{INVALID_JSON}: {exc.msg} at line {exc.lineno}, column {exc.colno}")
    except ValueError as exc:  # NaN, Infinity
        return Parsed(None, f"{INVALID_JSON}: {exc}")
    if schema is not None:
        error = next(iter(_validator(schema).iter_errors(value)), None)
        if error is not None:
            return Parsed(None, f"{SCHEMA_VIOLATION}: {error.message} at {error.json_path}")
    return Parsed(value)


def _validator(schema: Mapping[str, Any]) -> Any:
    found = _VALIDATORS.get(id(schema))
    if found is None or found[0] is not schema:
        import jsonschema  # 0.03 s of every start otherwise: only a stage with a schema needs it

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        found = _VALIDATORS[id(schema)] = (schema, cls(schema))
    return found[1]


def field_text(value: Any, field: str) -> Parsed:
    """The answer object's ``field`` as the text a parser reads: a string as it is, a list as its items joined by
    ", " (letters), anything else as JSON (``true``, ``7``); null is an empty answer. Invalid when the answer is
    not an object or has no such field."""
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return Parsed(None, f"{MISSING_FIELD}: the answer is {kind}, not an object with field {field!r}")
    if field not in value:
        return Parsed(None, f"{MISSING_FIELD}: no field {field!r} in the answer object")
    found = value[field]
    if found is None:
        return Parsed("")
    if isinstance(found, str):
        return Parsed(found)
    if isinstance(found, list):
        return Parsed(", ".join(item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
                                for item in found))
    return Parsed(json.dumps(found, ensure_ascii=False))
