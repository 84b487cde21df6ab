"""A run's providers and their endpoints: each endpoint's limits (runner/engine/limits.py) built on its first
request, each provider started (clients opened, weights loaded) on its first cache miss, once; and the connection
pool a provider's HTTP client needs for the requests its endpoints keep in flight (computed here, handed to each
provider in its settings when the run builds it: ``build_providers`` in runner/engine/checks.py; the providers
never import the engine). A pooled model's requests are routed among its endpoints by runner/engine/pools.py."""

from __future__ import annotations

import asyncio

from runner.engine.limits import DEFAULT_MAX_IN_FLIGHT, Endpoint, connection_room
from runner.engine.pools import Member, PoolRoute, members_of
from runner.engine.workers import Crew
from runner.errors import ProviderError
from runner.plan.request import Task
from runner.providers.base import Provider, ProviderSettings
from runner.spec.pools import Pool


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
                 crew: Crew | None = None, pools: dict[str, Pool] | None = None,
                 notes: list[str] | None = None) -> None:
        """``pools``: the job's pooled models (their endpoints' providers among ``providers``, under their labels);
        ``notes``: the run's notes, where an endpoint taken out is said."""
        self.providers = providers
        #: the job's pools, by the model they serve; each routed once its first request comes
        self.pools = pools or {}
        self._routes: dict[str, PoolRoute] = {}
        #: each pooled endpoint's member, by its endpoint's name
        self._members: dict[str, tuple[PoolRoute, Member]] = {}
        self._notes = notes if notes is not None else []
        #: the job's ``max_in_flight``: each endpoint's memory bound where its provider sets none
        self.max_in_flight = max_in_flight
        #: by endpoint name (provider + key + model: ``Provider.endpoint_key``)
        self.by_name: dict[str, Endpoint] = {}
        #: the processes working on the run, when several may: each takes its share of the rate limits
        self.crew = crew
        self._starting: dict[str, asyncio.Future[None]] = {}

    def of(self, req: Task, group: str | None = None) -> Endpoint:
        """The endpoint ``req`` is sent through (of a pooled model: the one its prompt-cache ``group`` goes to, else
        the one with the most room)."""
        if self.pools and req.model in self.pools:
            return self._route(req.model).choose(group).endpoint
        return self._endpoint(req.provider, req.model_name)

    def _route(self, model: str) -> PoolRoute:
        route = self._routes.get(model)
        if route is None:
            route = self._routes[model] = PoolRoute(model, [], self._notes)
            route.members = members_of(model, self.pools[model], self._member_endpoint)
            for member in route.members:
                self._members[member.endpoint.name] = (route, member)
        return route

    def _member_endpoint(self, label: str, provider: str, model_name: str) -> Endpoint:
        return self._endpoint(provider, model_name, label)

    def member(self, endpoint: Endpoint) -> tuple[PoolRoute, Member] | None:
        """The pool and member ``endpoint`` serves, None for an endpoint of no pool."""
        return self._members.get(endpoint.name) if self._members else None

    def current(self, endpoint: Endpoint, group: str | None) -> Member | None:
        """The pooled endpoint an attempt of a request admitted at ``endpoint`` goes to now: the same, unless it was
        taken out (then the one its pool routes the request's ``group`` to); None for an endpoint of no pool."""
        found = self.member(endpoint)
        if found is None:
            return None
        route, member = found
        return member if member.out is None else route.choose(group)

    def outcome(self, endpoint: Endpoint, exc: ProviderError | None) -> None:
        """How an attempt at a pooled ``endpoint`` went (None: answered): a failure may take it out."""
        found = self.member(endpoint)
        if found is not None:
            route, member = found
            if exc is None:
                route.succeeded(member)
            else:
                route.failed(member, exc)

    def moved(self, endpoint: Endpoint | None) -> bool:
        """Whether requests whose last attempt ``endpoint`` failed go on elsewhere: a pooled endpoint taken out
        while another of its pool serves."""
        found = self.member(endpoint) if endpoint is not None else None
        return found is not None and found[1].out is not None and bool(found[0].live())

    def _endpoint(self, provider_key: str, model_name: str, label: str | None = None) -> Endpoint:
        provider = self.providers[provider_key]
        name = provider.endpoint_key(model_name)
        if label is not None:  # two labels of one provider may share a base URL and a key variable
            name = f"{label}|{name}"
        found = self.by_name.get(name)
        if found is None:
            s = provider.settings_for(model_name)
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
