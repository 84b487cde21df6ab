"""Provider prompt caching planned by the runner (``prompt_cache: auto``): requests sharing a long prefix are found
in each chunk the dispatcher sends, one of each group goes first, and the others of its group wait for its answer,
so that the provider's cache holds the prefix when they arrive; groups are interleaved by the dispatch order, so
the rate limit stays full while a group's first request is out.

Groups. The chunk's requests to send, per model whose provider caches prompts (``Provider.prompt_cache_style``)
under a rule the runner knows (:func:`runner.plan.prefixes.cache_rule`), are sorted by their prompt text; a
request's longest shared prefix is the longer of those it shares with its two neighbours, cut where a token ends
(:func:`runner.plan.prefixes.shared_cut`), and counts when its tokens reach the provider's minimum. Its group is a
digest of the model and that prefix, the same in every chunk, so a group that spans chunks is warmed once. Where
the shorter neighbour's prefix is cacheable too (an instruction shared by all, a story shared by its questions),
it is a second breakpoint, so a new story's first question still reads the instruction from the cache.

Marks, by provider style: ``explicit`` (Anthropic) gets ``cache_control`` breakpoints at both cuts; ``keyed``
(OpenAI) gets the group as ``prompt_cache_key``; ``implicit`` (Gemini, Azure) is ordered only. Marks change what is
sent, never the task's call, so the memo's cache key is the same with or without them. The lifetime asked for is
5 minutes online (each read refreshes it, and a group's requests follow its first within seconds).

Warm. A group whose first request was answered is warm for :data:`WARM_FOR` seconds after its last use (less than
the providers' 5 minutes, for the clock's sake); after that its next request leads again. A first request that
failed releases its group all the same: the others are then sent as they would have been without the plan.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

from runner.plan.prefixes import CacheRule, cache_rule, cacheable, common_prefix, prompt_text, shared_cut
from runner.plan.request import CHAT, Task
from runner.providers.base import CacheMarks, Provider, split_model
from runner.providers.tokens import count_input_tokens
from runner.spec.schema import Job

__all__ = ["WARM_FOR", "PromptCachePlan"]

#: seconds a group stays warm after its last request was sent (the providers keep a prefix 5 minutes)
WARM_FOR = 240.0


class PromptCachePlan:
    """The dispatcher's prompt-cache groups: which requests lead, which wait, and the marks each is sent with."""

    def __init__(self, job: Job, providers: dict[str, Provider], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._on = {stage.name for stage in job.llm_stages() if job.stage_prompt_cache(stage) == "auto"}
        self._providers = providers
        self._rules: dict[str, CacheRule | None] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        #: per request key: its marks, until it is sent
        self._marks: dict[str, CacheMarks] = {}
        #: per group: the answer its first request is waiting for, or when it was last used (warm)
        self._groups: dict[str, asyncio.Future[Any] | float] = {}

    def _rule(self, task: Task) -> CacheRule | None:
        model = task.model
        if model not in self._rules:
            provider = self._providers.get(task.provider)
            style = getattr(provider, "prompt_cache_style", None)
            self._rules[model] = cache_rule(model) if style is not None else None
        return self._rules[model]

    def plan(self, tasks: list[Task]) -> None:
        """Group a chunk's requests to send (see the module's docstring)."""
        by_model: dict[str, list[Task]] = {}
        for task in tasks:
            if task.stage in self._on and task.call.kind == CHAT and self._rule(task) is not None:
                by_model.setdefault(task.model, []).append(task)
        for model, group in by_model.items():
            rule = self._rules[model]
            assert rule is not None
            texts = [prompt_text(task.call.messages) for task in group]
            order = sorted(range(len(group)), key=texts.__getitem__)
            links = [0] + [common_prefix(texts[a], texts[b]) for a, b in zip(order, order[1:], strict=False)] + [0]
            for position, index in enumerate(order):
                near = sorted({links[position], links[position + 1]} - {0})
                marks = self._marks_of(group[index], texts[index], near, rule)
                if marks is not None:
                    self._marks[group[index].key] = marks

    def _marks_of(self, task: Task, text: str, shared: list[int], rule: CacheRule) -> CacheMarks | None:
        cuts: list[tuple[int, int]] = []
        group = ""
        for chars in shared:  # the shorter prefix first
            # a token is at least one byte and a character at most four, and a message adds a few tokens: a prefix
            # this short cannot reach the minimum, whatever the tokenizer
            if chars * 4 + 8 * len(task.call.messages) < rule.minimum:
                continue
            cut = shared_cut(task.call.messages, chars)
            if cut is None or (cut.index, cut.offset) in cuts:
                continue
            head = text[:cut.chars]
            digest = hashlib.sha256(f"{task.model}\0{head}".encode()).hexdigest()[:32]
            tokens = self._tokens.get((task.model, digest))
            if tokens is None:
                provider, name = split_model(task.model)
                tokens = self._tokens[(task.model, digest)] = count_input_tokens(provider, name, list(cut.prefix))
            if cacheable(tokens, rule):
                cuts.append((cut.index, cut.offset))
                group = digest
        return CacheMarks(group, tuple(cuts)) if cuts else None

    def marks(self, task: Task) -> CacheMarks | None:
        """The marks to send ``task`` with (each attempt asks)."""
        return self._marks.get(task.key)

    def sent(self, task: Task) -> None:
        """``task`` was sent (or will not be): its marks are no longer needed."""
        self._marks.pop(task.key, None)

    def gate(self, task: Task, answer: asyncio.Future[Any]) -> asyncio.Future[Any] | None:
        """What ``task`` waits for before it is sent: its group's first request's ``answer`` while that is on its
        way; None when it may go now (its group is warm, or it leads it: then ``answer``, its own, is what the
        group waits for)."""
        marks = self._marks.get(task.key)
        if marks is None:
            return None
        now = self.clock()
        state = self._groups.get(marks.group)
        if isinstance(state, asyncio.Future) and not state.done():
            return state
        if state is None or (isinstance(state, float) and now - state > WARM_FOR):
            self._groups[marks.group] = answer
            return None
        self._groups[marks.group] = now
        return None
