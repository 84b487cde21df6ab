"""Provider prompt caching as the simulated server does it: which leading tokens of a request were read from a
cache an earlier request wrote, and which this request writes, by each API's documented rules, so a runner's
caching is measured against the server rather than assumed.

The prompt as tokens. The server counts a prompt by :mod:`runner.providers.sim_tokens`: 3 tokens for the request,
then per message 3 for its header and one per four characters of its text. The same sequence is the unit of
caching: a prefix of ``n`` tokens is the first ``n`` of that sequence, and two requests share it when those tokens
are equal (the same messages, roles and text, up to that point). A prefix is remembered by its SHA-256 under a scope
of (API, key, model), with the time it expires; reading it refreshes that time.

The rules (``rule`` of a wire format; the formats of the clouds' paths inherit their API's):

``openai``
    Automatic for prompts of 1,024 tokens or more; a hit is the longest cached prefix of 1,024 tokens plus a
    multiple of 128; a request's prefixes at those lengths are written when it is answered; an entry lives 5
    minutes from its last use. Usage: ``prompt_tokens_details.cached_tokens``. ``prompt_cache_key`` only steers
    which machine serves a request, so it changes nothing here. Source: platform.openai.com/docs/guides/
    prompt-caching ("Caching is enabled automatically for prompts that are 1024 tokens or longer", "cache hits
    occur in increments of 128 tokens", "Cached prefixes generally remain active for 5 to 10 minutes of
    inactivity").
``anthropic``
    Only where the request marks it: ``cache_control`` on a system or message text block (or at the top level,
    which marks the last block). A marked prefix shorter than the model's minimum is not cached. At each marked
    point, from the last to the first, the longest prefix cached is read; everything from there to the last marked
    point is written (its part up to the last point marked ``ttl: "1h"`` for an hour, the rest for 5 minutes).
    Usage: ``input_tokens`` (after the last marked point), ``cache_read_input_tokens``,
    ``cache_creation_input_tokens`` and ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``.
    Minimums by model (docs.claude.com/en/docs/build-with-claude/prompt-caching, "Cache limitations"): 4,096 for
    Opus 4.5 and later Opus and Haiku 4.5; 2,048 for Sonnet 4.6 and the Haiku 3 models; 1,024 for the others.
    More than four marked blocks are refused by the strict rules (``strict_anthropic``), not here. The docs'
    look-back of up to 20 blocks before a marked point is not simulated: a prefix is read only at a marked point.
``gemini``
    Implicit caching: automatic from 1,024 tokens (ai.google.dev/gemini-api/docs/caching, "Implicit caching"); the
    increments and lifetime are not documented: the server uses 128 tokens and 5 minutes, as for OpenAI. Usage:
    ``usageMetadata.cachedContentTokenCount``.

A prefix is written when its request is answered, not when it arrives, so requests sent together all miss (as the
providers say: a cache entry is available once the first response has begun). ``cache_min_tokens`` (a
:class:`~simserver.config.SimConfig` knob) replaces every minimum, for tests with short prompts;
``prompt_cache: false`` turns caching off. Batch lines are not cached.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.providers.sim_tokens import count_tokens, message_text

__all__ = ["CacheUse", "PromptCache", "anthropic_marks", "anthropic_minimum"]

#: seconds an entry lives from its last use: OpenAI's and Gemini's (the server's choice), Anthropic's two TTLs
SHORT = 300.0
HOUR = 3600.0
INCREMENT = 128
MINIMUM = 1024
#: entries kept at most per server (oldest dropped first), so a long benchmark stays bounded in memory
CAPACITY = 1_000_000


@dataclass(slots=True)
class CacheUse:
    """What one request read from and wrote to the prompt cache, in prompt tokens."""

    read: int = 0
    written: int = 0
    #: of ``written``, the tokens written for an hour (Anthropic's ``ttl: "1h"``)
    written_1h: int = 0
    #: the prefixes this request writes once it is answered: (hash, seconds to live)
    pending: list[tuple[str, float]] = field(default_factory=list)


def anthropic_minimum(model: str) -> int:
    """The fewest tokens a marked prefix needs to be cached, by Claude model (see the module's docstring)."""
    name = model.lower()
    if "haiku-4-5" in name or "haiku-4.5" in name or any(f"opus-{v}" in name for v in ("4-5", "4.5", "4-6", "4.6",
                                                                                         "4-7", "4.7", "5")):
        return 4096
    if "sonnet-4-6" in name or "sonnet-4.6" in name or "haiku-3" in name or "3-haiku" in name or "3-5-haiku" in name:
        return 2048
    return MINIMUM


def anthropic_marks(body: Mapping[str, Any]) -> list[tuple[int, int, float]]:
    """The marked points of a Messages body: (index of the message in the server's list, with the system prompt
    first when there is one; characters of that message's text up to the end of the marked block; seconds to
    live), in prompt order. A top-level ``cache_control`` marks the end of the last message."""
    marks: list[tuple[int, int, float]] = []

    def ttl(control: Any) -> float:
        return HOUR if isinstance(control, Mapping) and control.get("ttl") == "1h" else SHORT

    def walk(content: Any, index: int) -> None:
        if not isinstance(content, list):
            return
        end = 0
        for block in content:
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                end += len(block["text"])
                if block.get("cache_control") is not None:
                    marks.append((index, end, ttl(block["cache_control"])))

    index = 0
    if body.get("system") is not None:
        walk(body["system"], 0)
        index = 1
    turns = body.get("messages") or []
    for offset, turn in enumerate(turns):
        walk(turn.get("content") if isinstance(turn, Mapping) else None, index + offset)
    top = body.get("cache_control")
    if top is not None and turns:
        last = turns[-1].get("content") if isinstance(turns[-1], Mapping) else None
        length = len(last) if isinstance(last, str) else sum(
            len(b.get("text", "")) for b in last or [] if isinstance(b, Mapping) and isinstance(b.get("text"), str))
        marks.append((index + len(turns) - 1, length, ttl(top)))
    return marks


class _Tokens:
    """A request's prompt as the caching sees it: the hash of its first ``n`` tokens for any ``n``, or of its text up to
    a breakpoint."""

    def __init__(self, messages: list[Any]) -> None:
        self.parts: list[tuple[str, str]] = [(str(m.get("role", "")), message_text(m.get("content")))
                                             for m in messages]
        self.total = 3 + sum(3 + count_tokens(text) for _, text in self.parts)

    def at_mark(self, index: int, chars: int) -> int:
        """Tokens up to ``chars`` characters into message ``index``."""
        return 3 + sum(3 + count_tokens(text) for _, text in self.parts[:index]) + 3 + count_tokens(
            self.parts[index][1][:chars])

    def mark_hash(self, index: int, chars: int) -> str:
        """The hash of the prompt up to ``chars`` characters into message ``index`` (a marked block's end): exactly
        that text, so what follows a breakpoint never counts in it."""
        digest = hashlib.sha256(b"\x1dreq")
        for role, text in self.parts[:index]:
            digest.update(f"\x1e{role}\x1f".encode())
            digest.update(text.encode())
            digest.update(b"\x1c")
        role, text = self.parts[index]
        digest.update(f"\x1e{role}\x1f".encode())
        digest.update(text[:chars].encode())
        digest.update(b"\x1bmark")
        return digest.hexdigest()

    def hashes(self, lengths: list[int]) -> dict[int, str]:
        """The hash of the first ``n`` tokens for each ``n`` of ``lengths`` (each past the request's own 3 tokens
        and at most :attr:`total`)."""
        wanted = sorted(set(lengths))
        out: dict[int, str] = {}
        digest = hashlib.sha256(b"\x1dreq")
        done = 3
        i = 0
        for role, text in self.parts:
            if i == len(wanted):
                break
            size = 3 + count_tokens(text)
            while i < len(wanted) and wanted[i] <= done + size:
                n = wanted[i] - done  # tokens into this message
                part = digest.copy()
                header = f"\x1e{role}\x1f"
                part.update(header[:n].encode())
                if n > 3:
                    part.update(text[:4 * (n - 3)].encode())
                out[wanted[i]] = part.hexdigest()
                i += 1
            digest.update(f"\x1e{role}\x1f".encode())
            digest.update(text.encode())
            digest.update(b"\x1c")
            done += size
        return out


class PromptCache:
    """The server's prompt caches, one per (API, key, model)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.stats = {"hits": 0, "read": 0, "written": 0}

    def clear(self) -> None:
        self._entries.clear()
        self.stats = {"hits": 0, "read": 0, "written": 0}

    def _live(self, scope: str, digest: str, now: float, ttl: float) -> bool:
        expiry = self._entries.get((scope, digest))
        if expiry is None or expiry < now:
            return False
        self._entries[(scope, digest)] = now + ttl  # a read refreshes it
        self._entries.move_to_end((scope, digest))
        return True

    def look_up(self, rule: str | None, scope: str, messages: list[Any], body: Mapping[str, Any], model: str,
                minimum: int | None) -> CacheUse | None:
        """What a request of ``rule`` reads from the cache now and will write once answered; None without caching."""
        if rule is None:
            return None
        tokens = _Tokens(messages)
        now = self.clock()
        use = CacheUse()
        if rule == "anthropic":
            floor = anthropic_minimum(model) if minimum is None else minimum
            marks = [(tokens.at_mark(i, chars), tokens.mark_hash(i, chars), ttl)
                     for i, chars, ttl in anthropic_marks(body) if i < len(tokens.parts)]
            marks = [mark for mark in marks if mark[0] >= max(floor, 4)]
            if not marks:
                return use
            for n, digest, ttl in reversed(marks):
                if self._live(scope, digest, now, ttl):
                    use.read = n
                    break
            last = marks[-1][0]
            use.written = max(0, last - use.read)
            long_end = max((n for n, _, ttl in marks if ttl == HOUR), default=0)
            use.written_1h = max(0, min(long_end, last) - use.read)
            use.pending = [(digest, ttl) for n, digest, ttl in marks if n > use.read]
            return use
        floor = max(MINIMUM if minimum is None else minimum, 4)
        if tokens.total < floor:
            return use
        lengths = list(range(floor, tokens.total + 1, INCREMENT))
        hashes = tokens.hashes(lengths)
        for n in reversed(lengths):
            if self._live(scope, hashes[n], now, SHORT):
                use.read = n
                break
        use.pending = [(hashes[n], SHORT) for n in lengths if n > use.read]
        return use

    def answered(self, scope: str, use: CacheUse | None) -> None:
        """The request was answered: what it writes is cached from now on."""
        if use is None:
            return
        now = self.clock()
        for digest, ttl in use.pending:
            self._entries[(scope, digest)] = now + ttl
            self._entries.move_to_end((scope, digest))
        while len(self._entries) > CAPACITY:
            self._entries.popitem(last=False)
        if use.read:
            self.stats["hits"] += 1
        self.stats["read"] += use.read
        self.stats["written"] += use.written
