"""A run's providers and their endpoints: each endpoint's limits (runner/engine/limits.py) built on its first
request, each provider started (clients opened, weights loaded) on its first cache miss, once; and the connection
pool a provider's HTTP client needs for the requests its endpoints keep in flight (computed here, handed to each
provider in its settings when the run builds it: ``build_providers`` in runner/engine/checks.py; the providers
never import the engine)."""

from __future__ import annotations

import asyncio

from runner.engine.limits import DEFAULT_MAX_IN_FLIGHT, Endpoint, connection_room
from runner.engine.workers import Crew
from runner.plan.request import Task
from runner.providers.base import Provider, ProviderSettings


def in_flight_bound(settings: ProviderSettings, job_bound: int | None = None) -> int | None:
    """The memory bound the user set on one endpoint's requests in flight: the provider's ``max_in_flight``, else
    the job's; None when neither is set (the endpoint then takes ``DEFAULT_MAX_IN_FLIGHT`` unless an explicit
    ``concurrency`` says otherwise)."""
    return getattr(settings, "max_in_flight", None) or job_bound


def connection_pool_size(settings: ProviderSettings, job_bound: int | None = None, endpoints: int = 1) -> int:
    """Connections a provider's HTTP client must allow so that its pool never queues a request the engine let go:
    the most each of its ``endpoints`` (models) keeps in flight (its explicit ``concurrency``, else its memory
    bound), within what the process's open-files limit leaves for connections."""
    bounds = [bound for bound in (settings.concurrency, in_flight_bound(settings, job_bound)) if bound]
    per_endpoint = min(bounds) if bounds else DEFAULT_MAX_IN_FLIGHT
    return connection_room(per_endpoint * max(1, endpoints))


class Endpoints:
    def __init__(self, providers: dict[str, Provider], max_in_flight: int | None = None, *,
                 crew: Crew | None = None) -> None:
        self.providers = providers
        #: the job's ``max_in_flight``: each endpoint's memory bound where its provider sets none
        self.max_in_flight = max_in_flight
        #: by endpoint name (provider + key + model: ``Provider.endpoint_key``)
        self.by_name: dict[str, Endpoint] = {}
        #: the processes working on the run, when several may: each takes its share of the rate limits
        self.crew = crew
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
                name, concurrency=s.concurrency, max_in_flight=in_flight_bound(s, self.max_in_flight),
                opening=provider.default_concurrency, rpm=s.rpm, tpm=s.tpm, itpm=s.itpm, otpm=s.otpm,
                # a job that configures nothing lets the endpoint find its own concurrency until the
                # server's headers state the limits: a ramp from the provider's default
                adaptive=not limited and provider.adaptive, adaptive_start=provider.default_concurrency,
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
