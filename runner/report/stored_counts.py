"""The input tokens providers' token-counting endpoints counted for a job's prompts in earlier runs (the store's
``token_counts``, which runner/engine/exact_counts.py fills), for ``runner estimate``: a request whose prompt was
counted is shown, and its worst case priced, with that exact count instead of the byte bound. Nothing is asked of
any provider here (the estimate needs no key and no network); a provider whose ``count_tokens`` setting is off
would reserve the bound, so its counts are not looked for."""

from __future__ import annotations

from runner.plan.request import Task
from runner.providers.base import Provider, ProviderSettings, provider_class
from runner.providers.token_counts import count_key
from runner.spec.schema import Job
from runner.store import Store

__all__ = ["StoredCounts"]


class StoredCounts:
    """One job's stored counts, looked up a chunk of requests at a time."""

    def __init__(self, job: Job, store: Store) -> None:
        self.job = job
        self.store = store
        self._counters: dict[str, Provider | None] = {}

    def counter(self, name: str) -> Provider | None:
        """The provider ``name`` as a run builds it (never started), when it counts with an endpoint and its
        ``count_tokens`` setting is on; else None."""
        if name not in self._counters:
            provider = None
            try:
                cls = provider_class(name)
                if cls.count_request is not Provider.count_request:  # only a provider that counts is built
                    provider = cls(self.job.providers.get(name) or ProviderSettings(), self.job.endpoints)
            except Exception:  # noqa: BLE001 - a provider that cannot be built here: its requests are estimated
                provider = None
            self._counters[name] = provider if provider is not None and provider.settings.count_tokens else None
        return self._counters[name]

    def of(self, requests: list[Task]) -> dict[str, int]:
        """The stored counts of these requests, by their cache keys (one store query); a request never counted,
        or whose provider counts nothing, is left out."""
        keys: dict[str, str] = {}
        for req in requests:
            counter = self.counter(req.provider)
            if counter is None or req.call.pairs is not None:
                continue
            request = counter.count_request(req.model_name, req.messages, req.call.params)
            if request is not None:
                keys[req.key] = count_key(counter.name, counter.settings.base_url, req.model_name, request)
        if not keys:
            return {}
        found = self.store.token_counts(list(set(keys.values())))
        return {req_key: found[key] for req_key, key in keys.items() if key in found}
