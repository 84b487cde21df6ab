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
it is a second breakpoint, so a new story's first question still reads the instruction from the cache. Of two
prefixes that differ by fewer than :data:`LEVEL` tokens (the first words two questions happen to share) only the
shorter counts: grouping by the longer would split a document's questions by their first word, each group's first
request writing the document again.

Marks, by provider style: ``explicit`` (Anthropic) gets ``cache_control`` breakpoints at both cuts; ``keyed``
(OpenAI) gets the group as ``prompt_cache_key``; ``implicit`` (Gemini, Azure) is ordered only. Marks change what is
sent, never the task's call, so the memo's cache key is the same with or without them. The lifetime asked for is
5 minutes online (each read refreshes it, and a group's requests follow its first within seconds), an hour for a
Batch API's lines (:meth:`PromptCachePlan.mark_lines`), which the provider runs in an order of its own.

Warm. A group whose first request was answered is warm for :data:`WARM_FOR` seconds after its last use (less than
the providers' 5 minutes, for the clock's sake); after that its next request leads again. A first request that
failed releases its group all the same: the others are then sent as they would have been without the plan.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from runner.engine.null_parts import NoPromptCache, NoStoredPrompts
from runner.plan.prefixes import CacheRule, cache_rule, cacheable, common_prefix, prompt_text, shared_cut
from runner.plan.request import CHAT, Task
from runner.providers.base import CacheMarks, Provider, split_model
from runner.providers.tokens import bound_call_tokens, count_input_tokens, message_text
from runner.spec.schema import Job

if TYPE_CHECKING:  # a Batch API's lines and the stored prefixes: imported by a run that has them
    from runner.engine.stored_prompts import StoredPrompts
    from runner.providers.batching import BatchLine

__all__ = ["WARM_FOR", "NoPromptCache", "PromptCachePlan"]

#: seconds a group stays warm after its last request was sent (the providers keep a prefix 5 minutes)
WARM_FOR = 240.0
#: tokens a deeper shared prefix must add to a request's shorter one to be a group (and a breakpoint) of its own
LEVEL = 256
#: breakpoints a request is sent with at most, its deepest (Anthropic takes four a request)
MAX_CUTS = 3
#: prefix counts and cold groups kept at most (beyond, the oldest are forgotten)
KEPT = 4096


def _could_reach(messages: list[dict[str, Any]], minimum: int) -> bool:
    """Whether a prompt is long enough to hold ``minimum`` tokens whatever the tokenizer (a token is at least one
    byte, a character at most four, and a message adds a few tokens): a short one is not worth comparing."""
    return sum(len(message_text(m.get("content"))) for m in messages) * 4 + 8 * len(messages) >= minimum


def _intervals(links: list[int]) -> list[tuple[int, int, int]]:
    """The shared prefixes of prompts in sorted order, as (characters, first, last position): each maximal span of
    positions whose adjacent common prefixes (``links[i]``: of positions i and i + 1) are all at least that long,
    one per distinct length (the LCP intervals of the sorted prompts, found with one stack pass)."""
    out: list[tuple[int, int, int]] = []
    stack: list[tuple[int, int]] = []  # (characters, first position)
    for i, link in enumerate([*links, 0]):
        first = i
        while stack and stack[-1][0] > link:
            chars, first = stack.pop()
            out.append((chars, first, i))
        if link and (not stack or stack[-1][0] < link):
            stack.append((link, first))
    return out


class PromptCachePlan:
    """The run's prompt-cache groups: which requests lead, which wait, and the marks each is sent with."""

    def __init__(self, job: Job, providers: dict[str, Provider], clock: Callable[[], float] = time.monotonic, *,
                 stored: StoredPrompts | NoStoredPrompts | None = None) -> None:
        """``stored``: the prefixes the run stores at a provider that keeps them (none by default)."""
        self.clock = clock
        self._on = {stage.name for stage in job.llm_stages() if job.stage_prompt_cache(stage) == "auto"}
        self._providers = providers
        #: pooled models (runner/engine/pools.py): no prefix of theirs is stored at a provider, since each endpoint of
        #: the pool would need its own copy
        self._pooled = set(job.pools)
        self._rules: dict[str, CacheRule | None] = {}
        #: tokens of the prefixes counted lately, as expected and at most (a group spanning chunks is counted once),
        #: at most KEPT of them
        self._tokens: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        #: per request key: its marks, until it is sent
        self._marks: dict[str, CacheMarks] = {}
        #: per request key on its way: the cache writes its budget reservation was priced for (:meth:`writes`)
        self._priced: dict[str, tuple[int | None, bool]] = {}
        #: per group: the answer its first request is waiting for, or when it was last used (warm)
        self._groups: dict[str, asyncio.Future[Any] | float] = {}
        #: prefixes stored at the provider (Gemini's explicit cached contents), where a provider keeps them
        self.stored: StoredPrompts | NoStoredPrompts = stored if stored is not None else NoStoredPrompts()

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
            if task.stage in self._on and task.call.kind == CHAT and (rule := self._rule(task)) is not None \
                    and _could_reach(task.call.messages, rule.minimum):
                by_model.setdefault(task.model, []).append(task)
        for model, group in by_model.items():
            rule = self._rules[model]
            assert rule is not None
            texts = [prompt_text(task.call.messages) for task in group]
            order = sorted(range(len(group)), key=texts.__getitem__)
            links = [common_prefix(texts[a], texts[b]) for a, b in zip(order, order[1:], strict=False)]
            # per position: (tokens, cut, digest, at most how many tokens)
            levels: list[list[tuple[int, tuple[int, int], str, int]]] = [[] for _ in order]
            cuts: list[list[tuple[int, int]]] = [[] for _ in order]
            # the shared prefixes, shortest first (each encloses the longer ones within its span of positions)
            for chars, first, last in sorted(_intervals(links), key=lambda i: (i[1], -i[2])):
                found = self._level(group[order[first]], texts[order[first]], chars, rule)
                if found is None:
                    continue
                tokens, cut, digest, bound = found
                for position in range(first, last + 1):
                    above = levels[position]
                    # a level of its own only when it adds LEVEL tokens to the one above it (a story after an
                    # instruction), not a few words two questions happen to share: those would split a document's
                    # questions into groups, each writing the document again
                    if not above or tokens - above[-1][0] >= LEVEL:
                        above.append((tokens, cut, digest, bound))
                        cuts[position].append(cut)
            for position, index in enumerate(order):
                if levels[position]:
                    kept = tuple(cuts[position][-MAX_CUTS:])
                    _, _, digest, bound = levels[position][-1]  # the longest prefix: its last cut
                    self._marks[group[index].key] = CacheMarks(digest, kept, writable=bound)
            if model not in self._pooled and self.stored.serves(group[0]):
                self._marks.update(self.stored.choose(rule, [(task, self._marks[task.key]) for task in group
                                                             if task.key in self._marks]))

    def _level(self, task: Task, text: str, chars: int,
               rule: CacheRule) -> tuple[int, tuple[int, int], str, int] | None:
        """(tokens, cut, digest, at most how many tokens) of the first ``chars`` characters of ``task``'s prompt
        (``text``) cut where a token ends, when the provider caches that much; else None. The most is what a budget
        reserves at the cache-write price (``bound_call_tokens``: exact where the provider's count is)."""
        # a token is at least one byte and a character at most four, and a message adds a few tokens: a prefix this
        # short cannot reach the minimum, whatever the tokenizer
        if chars * 4 + 8 * len(task.call.messages) < rule.minimum:
            return None
        cut = shared_cut(task.call.messages, chars)
        if cut is None:
            return None
        digest = hashlib.sha256(f"{task.model}\0{text[:cut.chars]}".encode()).hexdigest()[:32]
        counted = self._tokens.get((task.model, digest))
        if counted is None:
            provider, name = split_model(task.model)
            prefix = list(cut.prefix)
            tokens = count_input_tokens(provider, name, prefix)
            counted = self._tokens[(task.model, digest)] = (tokens, bound_call_tokens(provider, name, prefix,
                                                                                      counted=tokens))
            if len(self._tokens) > KEPT:
                self._tokens.popitem(last=False)
        tokens, bound = counted
        return (tokens, (cut.index, cut.offset), digest, bound) if cacheable(tokens, rule) else None

    def mark_lines(self, provider: Provider, tasks: list[Task], lines: list[BatchLine]) -> list[BatchLine]:
        """A batch's lines (``lines[i]`` asks ``tasks[i]``) with the marks of the groups they form (planned by
        :meth:`plan` before their reservations, which are priced for them: :meth:`writes`), asking for the
        one-hour lifetime: a Batch API runs its lines over minutes to hours, in an order of its own (Anthropic's
        prompt-caching page advises the hour for batches). No line waits for another: the provider orders them."""
        if getattr(provider, "prompt_cache_style", None) is None:
            return lines
        from runner.providers.batching import BatchLine

        out = []
        for task, line in zip(tasks, lines, strict=True):
            marks = self._marks.pop(task.key, None)
            if marks is None:
                out.append(line)
                continue
            messages, params = provider.mark_prompt_cache(task.model_name, line.messages, line.params,
                                                          replace(marks, ttl="1h"))
            out.append(BatchLine(line.custom_id, messages, params))
        return out

    def marks(self, task: Task) -> CacheMarks | None:
        """The marks to send ``task`` with (each attempt asks): None where they would let the provider write more
        to its cache than the request's reservation was priced for (marks planned after it was reserved, by a
        later chunk holding the same request): it is sent unmarked then, within its reservation."""
        marks = self._marks.get(task.key)
        priced = self._priced.get(task.key)
        if marks is None or priced is None:
            return marks
        writable, hour = priced
        if writable is not None and (marks.writable is None or marks.writable > writable
                                     or (marks.ttl == "1h" and not hour)):
            return None
        return marks

    def writes(self, task: Task, batch: bool) -> tuple[int | None, bool]:
        """(at most how many input tokens ``task``'s request may write to the provider's cache, None: any; whether
        for an hour), as its marks let it: what its budget reservation prices at the cache-write price
        (``Reserver.cache_writes``). An unmarked request writes nothing; a batch line's marks ask for the hour.
        An online request's answer is remembered until it is forgotten, so that :meth:`marks` keeps to it."""
        marks = self._marks.get(task.key)
        priced = (0, False) if marks is None else (marks.writable, batch or marks.ttl == "1h")
        if not batch:
            self._priced[task.key] = priced
        return priced

    async def ready(self, task: Task, marks: CacheMarks) -> CacheMarks:
        """``marks`` as they are sent: with the name of the stored prefix they read, stored first when needed."""
        if marks.store_key is None:  # only the stored prefixes set one
            return marks
        return await self.stored.ready(task, marks)

    def forget(self, key: str) -> None:
        """The request ``key`` was sent, answered otherwise, or will not be sent: its marks are no longer needed."""
        self._marks.pop(key, None)
        self._priced.pop(key, None)

    def group(self, task: Task) -> str | None:
        """The digest of ``task``'s prompt-cache group (its longest shared prefix), None when it is in none: a pooled
        model sends a group's requests to one endpoint (runner/engine/pools.py)."""
        marks = self._marks.get(task.key)
        return marks.group if marks is not None else None

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
            if len(self._groups) > KEPT:  # forget the groups gone cold: memory stays flat (invariant 6)
                self._groups = {group: seen for group, seen in self._groups.items()
                                if not isinstance(seen, float) or now - seen <= WARM_FOR}
            return None
        self._groups[marks.group] = now
        return None
