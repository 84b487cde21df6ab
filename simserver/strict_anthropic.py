"""Strict mode's rules for Anthropic Messages (``POST /v1/messages``); :func:`refusal` is called by
:func:`simserver.strict.refusal`.

The ``anthropic-version`` header decides. The body's structure is the anthropic SDK's own request type
(``anthropic.types.message_create_params.MessageCreateParamsBase`` and the TypedDicts it names); SDK 2.x
types no longer name ``temperature``, ``top_p`` or ``top_k``, as version 2026-10-21 refuses them, so those
three are taken only under 2023-06-01. Unknown fields: "<field>: Extra inputs are not permitted". The rules
per model are this server's own (:func:`simserver.model_rules.facts`, each with its source): temperature range,
temperature with top_p, sampling refused on Claude Opus 4.7+, Sonnet 5+, Fable, Mythos, thinking forms and
budgets, effort levels, structured outputs (and where a platform serving Claude has them), output limit.
"""

from __future__ import annotations

import collections.abc
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from typing_extensions import is_typeddict

from .model_rules import ANTHROPIC_VERSIONS, Facts, facts
from .refusals import Refusal, is_number

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
        return None if is_number(value) else f"{where}: Input should be a valid number"
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


def refusal(body: dict[str, Any], model: str, headers: Mapping[str, str],
            platform: str | None = None) -> Refusal | None:
    """The refusal the Messages API gives this body, or None; ``platform`` (vertex, bedrock) is the cloud serving
    Claude, whose own rules apply beside the model's."""
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
            if value is not None and not is_number(value):
                return Refusal(f"{key}: Input should be a valid number")
            continue
        if key not in fields:
            return Refusal(f"{key}: Extra inputs are not permitted")
        if key != "model" and (problem := _conform(value, fields[key], key)) is not None:
            return Refusal(problem)
    if (problem := _cache_breakpoints(body)) is not None:
        return problem
    return _anthropic_model(body, facts("anthropic", model, platform))


@functools.cache
def _count_fields() -> dict[str, Any]:
    from anthropic.types import message_count_tokens_params

    return dict(_hints(message_count_tokens_params.MessageCountTokensParams))


def count_refusal(body: dict[str, Any], headers: Mapping[str, str] | None) -> Refusal | None:
    """The refusal ``POST /v1/messages/count_tokens`` gives this body: the ``anthropic-version`` header (unless
    ``headers`` is None: Claude on Vertex carries its version in the body), and the fields of the anthropic SDK's
    ``MessageCountTokensParams`` (no ``max_tokens``, no sampling fields)."""
    if headers is not None:
        version = headers.get("anthropic-version")
        if version not in ANTHROPIC_VERSIONS:
            return Refusal("anthropic-version: header is required" if not version else
                           f"anthropic-version: invalid version {version!r}")
    fields = _count_fields()
    for key, value in body.items():
        if key not in fields:
            return Refusal(f"{key}: Extra inputs are not permitted")
        if key != "model" and (problem := _conform(value, fields[key], key)) is not None:
            return Refusal(problem)
    missing = next((key for key in ("model", "messages") if key not in body), None)
    return Refusal(f"{missing}: Field required") if missing is not None else _cache_breakpoints(body)


#: Anthropic's limit on cache breakpoints and its words for going past it
#: (docs.claude.com/en/docs/build-with-claude/prompt-caching: "You can define up to 4 cache breakpoints")
_MAX_BREAKPOINTS = 4


def _cache_breakpoints(body: dict[str, Any]) -> Refusal | None:
    """At most four ``cache_control`` marks (tools, system and message blocks, and the top-level one), and no 1-hour
    mark after a 5-minute one ("cache entries with longer TTL must appear before shorter TTLs", same page; the
    refusal's wording is the server's own)."""
    ttls: list[str] = []

    def blocks(items: Any) -> None:
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and isinstance(item.get("cache_control"), Mapping):
                ttls.append(str(item["cache_control"].get("ttl") or "5m"))

    blocks(body.get("tools"))
    blocks(body.get("system"))
    for turn in body.get("messages") or []:
        if isinstance(turn, Mapping):
            blocks(turn.get("content"))
    if isinstance(body.get("cache_control"), Mapping):
        ttls.append(str(body["cache_control"].get("ttl") or "5m"))
    if len(ttls) > _MAX_BREAKPOINTS:
        return Refusal(f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(ttls)}.")
    if "1h" in ttls and "5m" in ttls and ttls.index("5m") < len(ttls) - 1 - ttls[::-1].index("1h"):
        return Refusal("cache_control: a block with ttl '1h' must not come after a block with ttl '5m'")
    return None


_THINKING_DOC = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


def _anthropic_model(body: dict[str, Any], model: Facts) -> Refusal | None:
    temperature, top_p, top_k = (body.get(name) for name in _SAMPLING)
    # (under 2026-10-21 no sampling field comes this far: the SDK 2.x types refuse them above)
    allowed = model.get("temperature", (0.0, 1.0))
    if allowed is None:  # Claude Opus 4.7+, Sonnet 5+, Fable, Mythos: no sampling parameter at all
        for name, value in zip(_SAMPLING, (temperature, top_p, top_k), strict=True):
            if value is not None:
                return Refusal(f"`{name}` is not supported for this model.")
    elif temperature is not None and not allowed[0] <= temperature <= allowed[1]:
        side = "less" if temperature > allowed[1] else "greater"
        bound = allowed[1] if side == "less" else allowed[0]
        return Refusal(f"temperature: Input should be {side} than or equal to {bound:g}")
    if top_p is not None and not 0 <= top_p <= 1:
        return Refusal(f"top_p: Input should be {'less' if top_p > 1 else 'greater'} than or equal to "
                       f"{1 if top_p > 1 else 0}")
    if temperature is not None and top_p is not None and model.get("temperature_with_top_p") is False:
        return Refusal("`temperature` and `top_p` cannot both be specified for this model. Please use only one.")
    max_tokens, limit = body.get("max_tokens"), model.get("max_output")
    if isinstance(max_tokens, int) and limit and max_tokens > limit:
        return Refusal(f"max_tokens: {max_tokens} > {limit}, which is the maximum allowed number of "
                       f"output tokens for {model.model}")
    thinking = body.get("thinking") or {}
    kind = thinking.get("type")
    if kind == "enabled":
        if model.get("reasoning") == "never":
            return Refusal(f"'{model.model}' does not support thinking.")
        if model.says("budget") and model.get("budget") is None:
            return Refusal("thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and "
                           "output_config.effort to control thinking behavior.")
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget < 1024:
            return Refusal("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if isinstance(budget, int) and isinstance(max_tokens, int) and budget >= max_tokens:
            return Refusal("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                           f"documentation at {_THINKING_DOC}#max-tokens-and-context-window-size")
    elif kind == "adaptive" and model.get("efforts") == ():
        return Refusal(f"adaptive thinking is not supported on this model ('{model.model}'); use thinking.type."
                       "enabled with budget_tokens.")
    elif kind == "disabled" and model.says("budget") and model.get("budget") is None:
        # the models that take only adaptive thinking refuse it disabled (Bedrock's adaptive thinking page): leave
        # thinking out instead
        return Refusal("thinking.type.disabled is not supported for this model. Omit thinking, or use "
                       "thinking.type.adaptive with output_config.effort.")
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
    if output_config.get("format") is not None and model.get("schema") is False:
        return Refusal(f"output_config.format: structured outputs are not supported on this model ('{model.model}')")
    effort = output_config.get("effort")
    if effort is not None and model.says("efforts"):
        efforts = model.get("efforts")
        if not efforts:
            return Refusal(f"output_config.effort: effort is not supported on this model ('{model.model}')")
        if effort not in efforts:
            return Refusal(f"output_config.effort: Input should be {' or '.join(repr(e) for e in efforts)}")
    return None
