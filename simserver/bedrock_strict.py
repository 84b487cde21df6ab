"""Strict mode's rules for AWS Bedrock (registered in :data:`simserver.strict.RULES` by :mod:`simserver.bedrock`).

Converse (``POST /model/{modelId}/converse``): the body is checked against botocore's own service model for
bedrock-runtime (``botocore/data/bedrock-runtime/2023-09-30/service-2.json``, shipped inside the installed botocore:
AWS's published definition of the API), shape by shape: unknown members, required members, union structures
(exactly one member), types, enums, lengths and numeric ranges (``inferenceConfig.temperature`` is 0 to 1 there,
``maxTokens`` at least 1). The words are Bedrock's: an unknown key is "Malformed input request: extraneous key
[...] is not permitted", a constraint "1 validation error detected: Value ... at '...' failed to satisfy
constraint: ..." (the AWS validation message every AWS JSON service answers with), a bad model id "The provided
model identifier is invalid." (the ``modelId`` pattern of the same model). ``outputConfig`` beyond its shape: an
``effort`` among the values its documentation names, a ``textFormat`` schema that is a JSON Schema document, and
structured outputs only on the models Bedrock lists (:mod:`simserver.model_rules`).

InvokeModel for Claude (``POST /model/{modelId}/invoke``): Bedrock's Messages body carries
``anthropic_version: "bedrock-2023-05-31"`` and no ``model`` (docs.aws.amazon.com/bedrock/latest/userguide/
model-parameters-anthropic-claude-messages.html); the rest is the Messages API of version 2023-06-01, checked by
:mod:`simserver.strict_anthropic` (the anthropic SDK's request types and the server's own rules per model, under the
model's Claude name, with what Bedrock serves of them: ``simserver.model_rules.PLATFORMS``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from runner.providers.bedrock_ids import claude_name

from . import strict_anthropic
from .model_rules import CONVERSE_EFFORTS, facts
from .refusals import Refusal, is_number

BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"
_TYPES = {"structure": "an object", "list": "a list", "map": "an object", "string": "a string",
          "integer": "an integer", "long": "an integer", "float": "a number", "double": "a number",
          "boolean": "a boolean", "blob": "a base64 string", "timestamp": "a timestamp"}


@functools.cache
def _operation(name: str) -> Any:
    """botocore's operation model of bedrock-runtime (None when botocore is not installed)."""
    try:
        import botocore.session
    except ImportError:
        return None
    return botocore.session.get_session().get_service_model("bedrock-runtime").operation_model(name)


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _violation(value: Any, where: str, constraint: str) -> str:
    return f"1 validation error detected: Value '{_shown(value)}' at '{where}' failed to satisfy constraint: " \
           f"{constraint}"


def _check(value: Any, shape: Any, where: str) -> str | None:
    """Why ``value`` does not fit the botocore ``shape``, in Bedrock's words, or None."""
    kind, meta = shape.type_name, shape.metadata
    if kind == "structure" and meta.get("document"):
        return None  # a Document is any JSON
    wanted = _TYPES.get(kind)
    fits = {"structure": isinstance(value, dict), "map": isinstance(value, dict), "list": isinstance(value, list),
            "string": isinstance(value, str), "blob": isinstance(value, str), "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "long": isinstance(value, int) and not isinstance(value, bool),
            "float": is_number(value), "double": is_number(value)}.get(kind, True)
    if not fits:
        return _violation(value, where, f"Member must be {wanted}")
    if kind == "structure":
        members = {name: member for name, member in shape.members.items() if "location" not in member.serialization}
        for key in value:
            if key not in members:
                return f"Malformed input request: extraneous key [{key}] is not permitted, please reformat your " \
                       "input and try again."
        for key in shape.required_members:
            if key in members and value.get(key) is None:
                return f"1 validation error detected: Value null at '{_join(where, key)}' failed to satisfy " \
                       "constraint: Member must not be null"
        if meta.get("union") and len(value) != 1:
            return _violation(value, where, "Member must have exactly one member set")
        for key, item in value.items():
            if item is not None and (problem := _check(item, members[key], _join(where, key))) is not None:
                return problem
        return None
    if kind in ("list", "map", "string") and (problem := _length(value, meta, where)) is not None:
        return problem
    if kind == "list":
        for i, item in enumerate(value):
            if (problem := _check(item, shape.member, f"{where}.{i + 1}.member")) is not None:
                return problem
    elif kind == "map":
        for key, item in value.items():
            if (problem := _check(item, shape.value, f"{where}.{key}")) is not None:
                return problem
    elif kind == "string" and shape.enum and value not in shape.enum:
        return _violation(value, where, f"Member must satisfy enum value set: [{', '.join(shape.enum)}]")
    elif kind in ("integer", "long", "float", "double"):
        if "min" in meta and value < meta["min"]:
            return _violation(value, where, f"Member must have value greater than or equal to {meta['min']}")
        if "max" in meta and value > meta["max"]:
            return _violation(value, where, f"Member must have value less than or equal to {meta['max']}")
    return None


def _length(value: Any, meta: Mapping[str, Any], where: str) -> str | None:
    if "min" in meta and len(value) < meta["min"]:
        return _violation(value, where, f"Member must have length greater than or equal to {meta['min']}")
    if "max" in meta and len(value) > meta["max"]:
        return _violation(value, where, f"Member must have length less than or equal to {meta['max']}")
    return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def converse_refusal(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """The refusal Bedrock's Converse gives this body (the model id is the path's), or None."""
    operation = _operation("Converse")
    if operation is None:
        return None
    shape = operation.input_shape
    model_shape = shape.members["modelId"]
    pattern = model_shape.metadata.get("pattern")
    if not 1 <= len(model) <= model_shape.metadata.get("max", 2048) or (pattern and not re.fullmatch(pattern, model)):
        return Refusal("The provided model identifier is invalid.")
    problem = _check(body, shape, "")
    if problem is None and isinstance(body.get("outputConfig"), dict):
        problem = _output_config(body["outputConfig"], model)
    return Refusal(problem) if problem is not None else None


def _output_config(config: dict[str, Any], model: str) -> str | None:
    """What the service model's shape leaves to words (OutputConfig, checked against it above): ``effort`` is a
    string of 0 to 16 characters whose documentation names its values; ``textFormat``'s ``schema`` is a String
    holding a JSON Schema; and only the models of the server's own rules take structured outputs
    (:mod:`simserver.model_rules`, from Bedrock's structured outputs page). The words are the AWS validation
    message's form; the last is this server's own."""
    effort = config.get("effort")
    if effort is not None and effort not in CONVERSE_EFFORTS:
        return _violation(effort, "outputConfig.effort", f"Member must satisfy enum value set: "
                                                         f"[{', '.join(CONVERSE_EFFORTS)}]")
    text_format = config.get("textFormat")
    if text_format is None:
        return None
    where = "outputConfig.textFormat.structure.jsonSchema.schema"
    schema = ((text_format.get("structure") or {}).get("jsonSchema") or {}).get("schema")
    try:
        parsed = json.loads(schema) if isinstance(schema, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return _violation(schema, where, "Member must be a JSON Schema document (a JSON object)")
    if facts("converse", model).get("schema") is False:
        return f"The model {model} does not support structured outputs (outputConfig.textFormat); use a model that " \
               "supports them."
    return None


def invoke_refusal(body: dict[str, Any], model: str, headers: Mapping[str, str], path: str) -> Refusal | None:
    """The refusal Bedrock's InvokeModel gives a Claude body, or None; other models' bodies are taken as they are
    (each model family has its own body, which this server does not answer)."""
    name = claude_name(model)
    if name is None:
        return Refusal(f"The simulated server answers InvokeModel only for Claude models, not {model}; use "
                       "Converse for the others.")
    version = body.get("anthropic_version")
    if version is None:
        return Refusal("Malformed input request: #: required key [anthropic_version] not found, please reformat "
                       "your input and try again.")
    if version != BEDROCK_ANTHROPIC_VERSION:
        return Refusal(f"Malformed input request: #/anthropic_version: {_shown(version)} is not a valid enum value "
                       f"(expected {BEDROCK_ANTHROPIC_VERSION}), please reformat your input and try again.")
    if "model" in body:
        return Refusal("Malformed input request: #: extraneous key [model] is not permitted, please reformat your "
                       "input and try again.")
    messages = {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}
    messages["model"] = name
    return strict_anthropic.refusal(messages, name, {"anthropic-version": "2023-06-01"}, platform="bedrock")


def count_refusal(body: dict[str, Any]) -> Refusal | None:
    """The refusal Bedrock's CountTokens gives this body (``{"input": ...}``; the model id is the path's), by the
    operation's input shape in botocore's service model, or None."""
    operation = _operation("CountTokens")
    if operation is None:
        return None
    members = {name: member for name, member in operation.input_shape.members.items()
               if "location" not in member.serialization}
    for key in body:
        if key not in members:
            return Refusal(f"Malformed input request: extraneous key [{key}] is not permitted, please reformat your "
                           "input and try again.")
    if body.get("input") is None:
        return Refusal("1 validation error detected: Value null at 'input' failed to satisfy constraint: Member must "
                       "not be null")
    problem = _check(body["input"], members["input"], "input")
    return Refusal(problem) if problem is not None else None
