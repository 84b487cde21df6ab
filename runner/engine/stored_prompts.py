"""Prompt prefixes stored at the provider for ``prompt_cache: auto`` (Gemini's explicit cached contents): which of
a chunk's shared prefixes to store, storing each once, keeping it while its requests are sent, paying for it in the
ledger, and deleting it when the run is done.

What may be stored. A provider that keeps prefixes (``Provider.stores_prompts``) keeps whole messages: a request
names the stored prefix and sends the messages after it. So the prefix stored for a request is its messages before
the deepest cut :class:`~runner.engine.prompt_cache.PromptCachePlan` found for it, when every system message is
among them (the cached content holds the system instruction: the request may not set one) and they reach the
model's minimum. Nothing sent differs from the prompt the task asks: the same messages, in the same order.

When it pays. Google promises nothing of implicit caching ("no cost saving guarantee"); an explicit cache is read at
the cached price by every request that names it, but it costs its tokens at the input price when it is created and
its storage per token-hour. For ``n`` requests of a chunk sharing a prefix of ``T`` tokens, stored for
:data:`TTL` seconds, against sending them uncached:

    saved = T x ((n - 1) x input - n x cached - storage x TTL / 3600)

and the prefix is stored when that is positive (for Gemini 2.5 Flash or Pro, from two requests on). A prefix
stored already (by an earlier chunk, or by an earlier process of the run: found by its label) is used whatever
``n``. A model without a storage price (:meth:`~runner.providers.pricing.Pricing.storage`) stores nothing.

Money. Before a prefix is stored, its creation and its storage for :data:`TTL` are reserved against the budgets
and in the ledger (never waiting: a prefix that does not fit is not stored, and its requests go as they are); once
the provider answers, the reservation becomes the charge, at the tokens the provider counted. Keeping it longer
is charged when asked for; deleting it early gives back the storage not used. A process killed in between leaves
the charge to the expiry it asked for, which is what the provider bills when nobody deletes it; its reservation
of a creation that got no answer becomes "possibly billed", as a request's does.

Resume and other workers. A stored prefix is labelled with the run and its digest; before storing one, the
provider's list is looked at, and a live prefix of the same label is used instead, so a resumed run or a second
worker does not store it again (two workers storing the same prefix at the same moment may both pay once).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from runner.engine.budget import Reservation
from runner.engine.null_parts import NoStoredPrompts
from runner.engine.reserver import Reserver
from runner.errors import ProviderError
from runner.plan.prefixes import CacheRule
from runner.plan.request import Task
from runner.providers.base import CacheMarks, Provider, StoredPrompt, split_model
from runner.providers.pricing import PER, Pricing
from runner.providers.tokens import count_input_tokens
from runner.store.base import now
from runner.store.rows import LedgerRow

__all__ = ["KEY", "TTL", "NoStoredPrompts", "StoredPrompts"]

log = logging.getLogger(__name__)

#: seconds a stored prefix is asked to live, and kept again for when a request finds less than RENEW left
TTL = 600.0
RENEW = 240.0
#: the ledger key of a stored prefix's charges: KEY + the provider's name of it
KEY = "stored-prompt:"


@dataclass(slots=True)
class _Prefix:
    """One prefix the run stores (or decided to)."""

    model: str
    stage: str
    messages: list[dict[str, Any]]
    tokens: int
    label: str
    stored: StoredPrompt | None = None
    #: while it is being stored: what the other requests of the prefix wait for
    storing: asyncio.Future[StoredPrompt | None] | None = None
    #: it could not be stored (refused, or no budget room): its requests go as they are
    failed: bool = False
    #: until when its storage is charged, to give back what is not used when it is deleted early
    paid_until: float = 0.0


class StoredPrompts:
    """A run's stored prompt prefixes, for :class:`~runner.engine.prompt_cache.PromptCachePlan`."""

    def __init__(self, *, run_id: str, providers: dict[str, Provider], reserver: Reserver,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self.providers = providers
        self.reserver = reserver
        self.pricing: Pricing = reserver.pricing
        self.clock = clock
        self._prefixes: dict[str, _Prefix] = {}
        self._tokens: dict[str, int] = {}
        #: per model: the labels of prefixes the provider keeps (looked up once a process, then kept up to date)
        self._listed: dict[str, dict[str, StoredPrompt]] = {}
        self._list_lock = asyncio.Lock()

    def serves(self, task: Task) -> bool:
        provider = self.providers.get(task.provider)
        return provider is not None and provider.stores_prompts and provider.stores_prompts_for(task.model_name) \
            and self.pricing.storage(task.model) is not None and self.reserver.priced(task.model)

    # -- planning (per chunk, no I/O) ------------------------------------------------------------------------
    def choose(self, rule: CacheRule, planned: list[tuple[Task, CacheMarks]]) -> dict[str, CacheMarks]:
        """The marks of the requests whose prefix is stored (or is to be): ``store_key`` and ``held`` set."""
        candidates: dict[str, list[tuple[Task, CacheMarks, int]]] = {}
        for task, marks in planned:
            found = self._prefix_of(task, marks, rule)
            if found is not None:
                digest, held = found
                candidates.setdefault(digest, []).append((task, marks, held))
        out: dict[str, CacheMarks] = {}
        for digest, members in candidates.items():
            prefix = self._prefixes.get(digest)
            if prefix is None:
                task, _, held = members[0]
                if not self._pays(task.model, self._tokens[digest], len(members)):
                    continue
                prefix = self._prefixes[digest] = _Prefix(
                    task.model, task.stage, list(task.call.messages[:held]), self._tokens[digest],
                    f"runner {self.run_id} {digest}")
            if prefix.failed:
                continue
            for task, marks, held in members:
                out[task.key] = replace(marks, store_key=digest, held=held)
        return out

    def _prefix_of(self, task: Task, marks: CacheMarks, rule: CacheRule) -> tuple[str, int] | None:
        """(digest, messages) of the prefix ``task`` could read stored: its whole messages before its deepest cut,
        all its system messages among them, reaching the model's minimum; None when there is none."""
        messages = task.call.messages
        held = marks.cuts[-1][0] if marks.cuts else 0
        if held < 1 or held >= len(messages) or any(m.get("role") == "system" for m in messages[held:]):
            return None
        digest = hashlib.sha256(json.dumps([task.model, messages[:held]], sort_keys=True,
                                           ensure_ascii=False).encode()).hexdigest()[:32]
        tokens = self._tokens.get(digest)
        if tokens is None:
            provider, name = split_model(task.model)
            tokens = self._tokens[digest] = count_input_tokens(provider, name, list(messages[:held]))
        return (digest, held) if tokens >= rule.minimum else None

    def _pays(self, model: str, tokens: int, requests: int) -> bool:
        """Whether storing a prefix of ``tokens`` read by ``requests`` requests costs less than sending it with
        each (see the module's docstring)."""
        rates = self.pricing.rates(model)
        storage = self.pricing.storage(model)
        if rates is None or storage is None:
            return False
        rates = rates.at(tokens)
        saved = (requests - 1) * rates.input - requests * rates.cached_input - storage * TTL / 3600
        return saved > 0

    # -- sending ----------------------------------------------------------------------------------------------
    async def ready(self, task: Task, marks: CacheMarks) -> CacheMarks:
        """``marks`` with the stored prefix's name, storing it first if no request did (or kept longer when it
        is close to its end); without the prefix when it cannot be had."""
        prefix = self._prefixes.get(marks.store_key or "")
        if prefix is None or prefix.failed:
            return replace(marks, store_key=None, held=0)
        provider = self.providers[task.provider]
        stored = prefix.stored
        if stored is not None and provider.prompt_gone(stored.name):
            self._listed.get(task.model, {}).pop(prefix.label, None)
            prefix.stored = stored = None
        if stored is None:
            if prefix.storing is None:
                prefix.storing = asyncio.ensure_future(self._store(provider, task, prefix))
            stored = await asyncio.shield(prefix.storing)
            if prefix.storing is not None and prefix.storing.done():
                prefix.storing = None
            if stored is None:
                return replace(marks, store_key=None, held=0)
        elif stored.expires - self.clock() < RENEW:
            stored = await self._keep(provider, task, prefix, stored)
            if stored is None:
                return replace(marks, store_key=None, held=0)
        return replace(marks, stored=stored.name)

    async def _listing(self, provider: Provider, task: Task) -> dict[str, StoredPrompt]:
        """The labels of the prefixes the provider keeps for ``task``'s model (one look a process)."""
        async with self._list_lock:
            listed = self._listed.get(task.model)
            if listed is None:
                try:
                    found = await provider.stored_prompts(task.model_name)
                except ProviderError as exc:
                    log.info("could not list stored prompts of %s: %s", task.model, exc)
                    found = []
                listed = self._listed[task.model] = {p.label: p for p in found if p.expires > self.clock()}
            return listed

    async def _store(self, provider: Provider, task: Task, prefix: _Prefix) -> StoredPrompt | None:
        listed = await self._listing(provider, task)
        found = listed.get(prefix.label)
        if found is not None and found.expires - self.clock() > RENEW:
            prefix.stored, prefix.paid_until = found, found.expires  # stored by an earlier process: paid then
            return found
        rates = self.pricing.rates(task.model)
        storage = self.pricing.storage(task.model)
        assert rates is not None and storage is not None
        usd = prefix.tokens * (rates.at(prefix.tokens).input + storage * TTL / 3600) / PER
        reservation = await self.reserver.reserve_extra(prefix.stage, prefix.model, KEY + prefix.label, usd)
        if reservation is None:
            prefix.failed = True
            self.reserver.stats.notes.append(f"no budget room to store a prompt prefix of {prefix.model}: its "
                                             "requests are sent whole")
            return None
        try:
            stored = await provider.store_prompt(task.model_name, prefix.messages, TTL, prefix.label)
        except ProviderError as exc:
            self.reserver.release(reservation)
            prefix.failed = True
            self.reserver.stats.notes.append(f"could not store a prompt prefix of {prefix.model} ({exc}): its "
                                             "requests are sent whole")
            return None
        created = self.clock()
        cost = stored.tokens * (rates.at(stored.tokens).input
                                + storage * max(0.0, stored.expires - created) / 3600) / PER
        self._charge(prefix, stored, cost, reservation)
        prefix.stored, prefix.paid_until = stored, stored.expires
        listed[prefix.label] = stored
        return stored

    async def _keep(self, provider: Provider, task: Task, prefix: _Prefix,
                    stored: StoredPrompt) -> StoredPrompt | None:
        """Keep ``stored`` :data:`TTL` seconds from now, its extra storage reserved and charged."""
        storage = self.pricing.storage(task.model) or 0.0
        more = stored.tokens * storage * max(0.0, self.clock() + TTL - prefix.paid_until) / 3600 / PER
        reservation = await self.reserver.reserve_extra(prefix.stage, prefix.model, KEY + stored.name, more)
        if reservation is None:
            return stored  # no room to keep it longer: used while it lasts
        try:
            expires = await provider.keep_prompt(stored.name, TTL)
        except ProviderError as exc:
            self.reserver.release(reservation)
            log.info("could not keep stored prompt %s: %s", stored.name, exc)
            return stored if stored.expires > self.clock() else None
        cost = stored.tokens * storage * max(0.0, expires - prefix.paid_until) / 3600 / PER
        self._charge(prefix, stored, cost, reservation)
        prefix.stored = stored = replace(stored, expires=expires)
        prefix.paid_until = max(prefix.paid_until, expires)
        return stored

    def _charge(self, prefix: _Prefix, stored: StoredPrompt, usd: float, reservation: Reservation | None) -> None:
        """``usd`` charged for ``stored`` in the ledger (in place of ``reservation``'s row) and the budgets."""
        row = LedgerRow(self.run_id, prefix.stage, prefix.model, KEY + stored.name, "charge", usd, now())
        released = [(reservation.ledger_id,)] if reservation is not None and reservation.ledger_id else []
        self.reserver.store.post("write_batch", [], [], [row], released)  # in order, without waiting
        if reservation is not None:
            self.reserver.settle(reservation, usd, 0)
        elif self.reserver.budgets is not None:
            self.reserver.budgets.spend(prefix.stage, prefix.model, usd, 0)
        counters = self.reserver.stats.counters(prefix.stage, prefix.model)
        counters.spend += usd
        counters.cache_saved -= usd  # what caching saved is net of what storing the prefix cost

    async def close(self) -> None:
        """Delete the prefixes this process stored or used, giving back the storage paid beyond now."""
        for prefix in self._prefixes.values():
            stored = prefix.stored
            if stored is None:
                continue
            provider = self.providers[split_model(prefix.model)[0]]
            try:
                await provider.drop_prompt(stored.name)
            except ProviderError as exc:  # kept until it expires: paid to then already
                log.info("could not delete stored prompt %s: %s", stored.name, exc)
                continue
            prefix.stored = None
            left = prefix.paid_until - self.clock()
            storage = self.pricing.storage(prefix.model) or 0.0
            if left > 0 and storage:
                self._charge(prefix, stored, -stored.tokens * storage * left / 3600 / PER, None)
