"""Shared prompt prefixes as the providers' prompt caches see them: which leading part of each request an earlier
request of the same model already sent (read from the cache), and which part a later one will need (written).

A prompt is read as the providers serialize it: the system message first, then the messages in order, each its
role and its text. Two requests share the longest common leading part of that text; it counts in tokens, by the
runner's own counter (``runner.providers.tokens``: exact where the provider's tokenizer is here, the expected
count elsewhere), and it is cacheable only from the provider's minimum cacheable length on, in its increments
(:func:`cache_rule`). Per request:

- ``read``: the cacheable part of its longest common prefix with any *earlier* request of the same model;
- ``written``: what it adds to the cache for a later request: the cacheable part of its longest common prefix with
  any *later* request of the same model, less what it read (0 when no later request shares more).

This is the best a planner can do (every repeat of a cacheable prefix read from the cache, each prefix written
once), which is what ``runner costs RUN --cached`` prices and what the planner groups by. Lifetimes are not
modelled: a run's requests are taken to be sent within the cache's lifetime of each other.

The search is not over all pairs: each model's prompts are sorted, the longest common prefix of a request with any
other is then that with a neighbour in the sorted order (the minimum of the adjacent ones between them), and the
nearest earlier (later) neighbour on each side is found with one stack pass each way: O(n log n) in all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.providers.base import provider_class, split_model
from runner.providers.tokens import count_input_tokens, message_text

__all__ = ["CacheRule", "Cut", "PrefixUse", "cache_rule", "cacheable", "common_prefix", "prefix_use", "prompt_text",
           "shared_cut"]

#: a role's end and a message's end in the serialized prompt (characters no prompt text is made of)
_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"


@dataclass(frozen=True, slots=True)
class CacheRule:
    """How a provider caches prompt prefixes: from ``minimum`` tokens on, in steps of ``increment`` tokens."""

    minimum: int
    increment: int
    #: where the numbers come from
    source: str


_ANTHROPIC_DOC = "docs.claude.com/en/docs/build-with-claude/prompt-caching (minimum cacheable prompt length)"
_OPENAI_DOC = "platform.openai.com/docs/guides/prompt-caching (1,024 tokens, then hits in 128-token increments)"
_GEMINI_DOC = ("ai.google.dev/gemini-api/docs/caching (implicit caching's minimum input tokens: 2.5 Flash 1,024, "
               "2.5 Pro 2,048, later Pro models 4,096)")

#: Anthropic's minimum cacheable length by model family (name fragments, the first that matches); 1,024 otherwise
#: (Opus 4.1, Opus 4, Sonnet 4.5, Sonnet 4, Sonnet 3.7): docs.claude.com/en/docs/build-with-claude/prompt-caching
_ANTHROPIC_MINIMUM = (("opus-4-5", 4096), ("opus-4-6", 4096), ("haiku-4-5", 4096), ("sonnet-4-6", 2048),
                      ("haiku", 2048))


def _rule(family: str, model: str) -> CacheRule | None:
    if family == "anthropic":
        minimum = next((n for fragment, n in _ANTHROPIC_MINIMUM if fragment in model), 1024)
        return CacheRule(minimum, 1, _ANTHROPIC_DOC)
    if family in ("openai", "azure-openai", "sim"):  # sim: speaks OpenAI's format, and is cached as OpenAI caches
        return CacheRule(1024, 128, _OPENAI_DOC)
    if family == "gemini":
        minimum = 1024 if "flash" in model else 2048 if "2.5-pro" in model else 4096
        return CacheRule(minimum, 1, _GEMINI_DOC)
    return None


def cache_rule(model: str) -> CacheRule | None:
    """The prompt-cache rule of a job's model (``provider:name``), read under the name whose rules the provider's
    model follows (Claude on Vertex or Bedrock as Anthropic's); None: the provider caches no prompts the runner
    knows of (local models, user servers)."""
    provider, name = split_model(model)
    try:
        cls = provider_class(provider)
    except KeyError:
        return None
    family, rule_name = cls.capability_model(name) or (provider, name)
    if provider == "vertex" and family == provider:
        family = "gemini"
    return _rule(family, rule_name.lower())


def cacheable(tokens: int, rule: CacheRule | None) -> int:
    """The part of a shared prefix of ``tokens`` tokens the provider caches: none under its minimum, else the
    minimum and whole increments past it."""
    if rule is None or tokens < rule.minimum:
        return 0
    return rule.minimum + (tokens - rule.minimum) // rule.increment * rule.increment


@dataclass(frozen=True, slots=True)
class PrefixUse:
    """One request's use of the prompt cache (tokens)."""

    #: its longest common prefix with an earlier request of the same model
    shared: int
    #: read from the cache
    read: int
    #: written to the cache for a later request
    written: int


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """A request's prompt as the caches compare it: each message's role and text, in order (the system first)."""
    return "".join(f"{m.get('role', '')}{_ROLE_END}{message_text(m.get('content'))}{_MESSAGE_END}"
                   for m in messages)


#: tokens of a prompt's leading messages: (model, messages) -> count
Counter = Callable[[str, Sequence[Mapping[str, Any]]], int]


def _runner_count(model: str, messages: Sequence[Mapping[str, Any]]) -> int:
    provider, name = split_model(model)
    return count_input_tokens(provider, name, messages)


def prefix_use(requests: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], *,
               count: Counter | None = None) -> list[PrefixUse]:
    """Per request ``(model, messages)``, in the order given (the order they are sent), what it reads from and
    writes to its provider's prompt cache. ``count``: tokens of a list of messages for a model (default: the
    runner's counter); a shared part of a message counts as a message of that part (up to its last whitespace)."""
    count = count or _runner_count
    texts = [prompt_text(messages) for _, messages in requests]
    earlier, later = [0] * len(requests), [0] * len(requests)
    by_model: dict[str, list[int]] = {}
    for index, (model, _) in enumerate(requests):
        by_model.setdefault(model, []).append(index)
    for indices in by_model.values():
        ordered = sorted(indices, key=texts.__getitem__)
        adjacent = [0] + [common_prefix(texts[a], texts[b]) for a, b in zip(ordered, ordered[1:], strict=False)]
        _nearest(ordered, adjacent, earlier, before=True)
        _nearest(ordered, adjacent, later, before=False)
    tokens_of: dict[tuple[str, int, int], int] = {}
    rules: dict[str, CacheRule | None] = {}
    out = []
    for index, (model, messages) in enumerate(requests):
        if model not in rules:
            rules[model] = cache_rule(model)
        rule = rules[model]
        shared = _tokens(model, messages, texts[index], earlier[index], count, tokens_of)
        ahead = _tokens(model, messages, texts[index], later[index], count, tokens_of) if rule is not None else 0
        read = cacheable(shared, rule)
        out.append(PrefixUse(shared=shared, read=read, written=max(0, cacheable(ahead, rule) - read)))
    return out


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (a binary search over slices compared in C)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _nearest(ordered: list[int], adjacent: list[int], best: list[int], *, before: bool) -> None:
    """For each request, the longest common prefix (characters) with any request sent before it (``before``) or
    after it, into ``best``: the nearest such request on each side in the sorted order shares the most, found with
    a stack of (request index, smallest adjacent prefix between it and the current position)."""
    for positions in (range(len(ordered)), range(len(ordered) - 1, -1, -1)):
        stack: list[list[int]] = []
        step_back = positions.step == -1
        for position in positions:
            index = ordered[position]
            if stack:  # the prefix between the previous position and this one
                link = adjacent[position + 1] if step_back else adjacent[position]
                stack[-1][1] = min(stack[-1][1], link)
            while stack and (stack[-1][0] > index if before else stack[-1][0] < index):
                _, gap = stack.pop()
                if stack:
                    stack[-1][1] = min(stack[-1][1], gap)
            if stack:
                best[index] = max(best[index], stack[-1][1])
            stack.append([index, 1 << 62])


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a shared prefix of a prompt ends: its whole ``messages`` first, then, when ``offset`` > 0, the first
    ``offset`` characters of message ``index`` (the rest of that message and the messages after it are not shared)."""

    prefix: tuple[Mapping[str, Any], ...]
    index: int
    offset: int
    #: characters of :func:`prompt_text` the prefix covers
    chars: int


def shared_cut(messages: Sequence[Mapping[str, Any]], shared: int) -> Cut | None:
    """The prefix of a prompt within its first ``shared`` characters of :func:`prompt_text`: its whole messages in
    them, and of the next message (when its role is shared too) the shared text up to its last whitespace, where a
    token ends in every tokenizer the runner counts with (so a word cut in two is not counted, and prompts sharing
    the same words share one cut); None when not even that is shared."""
    prefix: list[Mapping[str, Any]] = []
    offset = 0
    for index, message in enumerate(messages):
        role = str(message.get("role", ""))
        body = message_text(message.get("content"))
        end = offset + len(role) + 1 + len(body) + 1
        if end <= shared:
            prefix.append(message)
            offset = end
            continue
        start = offset + len(role) + 1
        part = body[:max(0, shared - start)]
        cut = max(part.rfind(" "), part.rfind("\n"), part.rfind("\t"))
        if cut > 0:
            prefix.append({"role": role, "content": part[:cut]})
            return Cut(tuple(prefix), index, cut, start + cut)
        break
    return Cut(tuple(prefix), len(prefix), 0, offset) if prefix else None


def _tokens(model: str, messages: Sequence[Mapping[str, Any]], text: str, shared: int, count: Counter,
            memo: dict[tuple[str, int, int], int]) -> int:
    """Tokens of the first ``shared`` characters of a prompt (:func:`shared_cut`), counted once per distinct
    prefix."""
    cut = shared_cut(messages, shared)
    if cut is None:
        return 0
    key = (model, cut.chars, hash(text[:cut.chars]))
    found = memo.get(key)
    if found is None:
        memo[key] = found = count(model, list(cut.prefix))
    return found
