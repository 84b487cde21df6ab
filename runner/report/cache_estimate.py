"""What provider prompt caching is expected to save on a stage's requests to send, for ``runner estimate``, and the
warning for prompts whose shared part comes after a part that varies (which no provider can cache).

The expectation is the planner's (runner/engine/prompt_cache.py): requests sent in groups, each prefix written once
and read by the others of its group, within the cache's lifetime. It is computed per block of :data:`BLOCK`
requests in plan order by :func:`runner.plan.prefixes.prefix_use` (the dispatcher groups a chunk at a time, too), so
a prefix shared across blocks is counted as written again at the start of each block: a small overstatement of the
cost, never of the saving. Read tokens are priced at the model's cache-read price, written ones at its cache-write
premium over the input price (Anthropic's; none for OpenAI and Gemini, whose writes cost the input price).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runner.plan.prefixes import CacheRule, cache_rule, cacheable, prefix_use, prompt_text
from runner.providers.base import ProviderSettings, provider_class, split_model
from runner.providers.pricing import PER, Pricing, Rates
from runner.spec.schema import Job

__all__ = ["BLOCK", "CacheSums", "caching_rule", "storage_price"]

#: requests grouped at a time
BLOCK = 1000
#: prompts of a stage and model the reorder warning compares
SAMPLE = 32


def storage_price(job: Job, model: str) -> float | None:
    """USD per million tokens per hour of the prefixes the runner stores at the provider for ``model``
    (runner/engine/stored_prompts.py), or None when it stores none for it."""
    provider, name = split_model(model)
    try:
        cls = provider_class(provider)
    except KeyError:
        return None
    if not cls.stores_prompts:
        return None
    settings = job.providers.get(provider) or ProviderSettings()
    if not cls(settings).stores_prompts_for(name):
        return None
    return Pricing(job).storage(model)


def caching_rule(model: str) -> CacheRule | None:
    """The prompt-cache rule the runner plans ``model``'s requests by, or None when it plans none for it."""
    provider, _ = split_model(model)
    try:
        if getattr(provider_class(provider), "prompt_cache_style", None) is None:
            return None
    except KeyError:
        return None
    return cache_rule(model)


class CacheSums:
    """The cache reads and writes expected on one stage and model's requests to send."""

    def __init__(self, stage: str, model: str, rule: CacheRule, storage: float | None = None) -> None:
        self.stage, self.model, self.rule = stage, model, rule
        #: where the runner stores the shared prefixes at the provider (Gemini's explicit caching), their storage
        #: price per million tokens per hour
        self.storage = storage
        self.read = 0
        self.written = 0
        self._block: list[tuple[str, Sequence[Mapping[str, Any]]]] = []
        self._sample: list[str] = []

    def add(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self._block.append((self.model, messages))
        if len(self._sample) < SAMPLE:
            self._sample.append(prompt_text(messages))
        if len(self._block) >= BLOCK:
            self._flush()

    def _flush(self) -> None:
        for use in prefix_use(self._block):
            self.read += use.read
            self.written += use.written
        self._block = []

    def saving(self, rates: Rates) -> float:
        """USD the expected reads save, less the expected writes' premium, at the model's base rates; a prefix
        stored at the provider is also read by its first request and kept for the stored prefixes' TTL."""
        self._flush()
        saved = self.read * (rates.input - rates.cached_input) - self.written * (rates.cache_write - rates.input)
        if self.storage is not None:
            from runner.engine.stored_prompts import TTL  # the engine's modules load only where a model stores

            saved -= self.written * (rates.cached_input + self.storage * TTL / 3600)
        return saved / PER

    def reorder_warning(self) -> str | None:
        """A sentence when the sampled prompts share a cacheable ending but no cacheable beginning."""
        if len(self._sample) < 2:
            return None
        head = os.path.commonprefix(self._sample)
        tail = os.path.commonprefix([text[::-1] for text in self._sample])[::-1]
        # the shared ending's words, up to the end of the message it starts in (prompt_text's separators)
        readable = next((piece.strip() for piece in re.split("[\x1e\x1f]", tail) if piece.strip()), "")
        if cacheable(len(head) // 4, self.rule) or not cacheable(len(tail) // 4, self.rule) or not readable:
            return None
        return (f"stage {self.stage}: its prompts to {self.model} end with the same ~{len(tail) // 4:,} tokens but "
                f"begin with a part that varies, and a provider caches only a shared beginning: put the varying "
                f"fields after the text starting \"{readable[:40]}\" (in the prompt template) to have it cached")
