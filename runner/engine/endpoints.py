"""A run's providers and their endpoints: each endpoint's limits (runner/engine/limits.py) built on its first
request, each provider started (clients opened, weights loaded) on its first cache miss, once."""

from __future__ import annotations

import asyncio

from runner.engine.limits import Endpoint
from runner.engine.workers import Crew
from runner.plan.request import Task
from runner.providers.base import Provider


class Endpoints:
    def __init__(self, providers: dict[str, Provider]) -> None:
        self.providers = providers
        #: by endpoint name (provider + key + model: ``Provider.endpoint_key``)
        self.by_name: dict[str, Endpoint] = {}
        #: the processes working on the run, when several may: each takes its share of the rate limits
        self.crew: Crew | None = None
        self._starting: dict[str, asyncio.Future[None]] = {}

    def of(self, req: Task) -> Endpoint:
        """The endpoint ``req`` is sent through."""
        provider = self.providers[req.provider]
        name = provider.endpoint_key(req.model_name)
        found = self.by_name.get(name)
        if found is None:
            s = provider.settings_for(req.model_name)
            limited = any((s.rpm, s.tpm, s.itpm, s.otpm, s.concurrency))
            found = self.by_name[name] = Endpoint(
                name, concurrency=s.concurrency or provider.default_concurrency, rpm=s.rpm, tpm=s.tpm,
                itpm=s.itpm, otpm=s.otpm,
                # a job that configures nothing lets the endpoint find its own concurrency until the
                # server's headers state the limits
                adaptive=not limited and provider.adaptive,
            )
            if self.crew is not None:
                found.set_share(1 / self.crew.live)
        return found

    def share(self, live: int) -> None:
        """Split every endpoint's rate limits with the ``live`` processes working on the run now."""
        for endpoint in self.by_name.values():
            endpoint.set_share(1 / live)

    async def start(self, provider: str) -> None:
        """Start the provider once; every caller waits for that one start."""
        starting = self._starting.get(provider)
        if starting is None:
            starting = self._starting[provider] = asyncio.ensure_future(self.providers[provider].start())
        await asyncio.shield(starting)
