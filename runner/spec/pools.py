"""Pooled endpoints: one model served by several endpoints (``pools:``), their schema and the checks made of them
before anything is sent.

A pool names the model as the job's ``models:`` do (``anthropic:claude-haiku-4-5``) and the endpoints that serve
it: a provider (``anthropic``: its ``providers:`` settings), or a provider and a label (``anthropic:eu``: the
settings ``providers: {anthropic:eu: {...}}``, over the provider's own), each optionally with the model's name at
that endpoint (``{endpoint: bedrock:us-east-1, model: us.anthropic.claude-haiku-4-5-20251001-v1:0}``). At run time
each endpoint keeps its own limiter, prompt caches and price (runner/engine/pools.py).

The memo keys every answer of a pooled model as it keys the model the pool names. That is only right when the
endpoints' answers would share that key anyway (one provider, one model id: several keys, regions or base URLs of
it), or when the job says they serve the same weights (``same_model: true``); a pool of endpoints whose answers
would be keyed apart is refused without it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from runner.errors import RunnerError
from runner.providers.base import ProviderSettings, provider_class, split_model
from runner.spec.fields import Strict
from runner.spec.problems import Problems, fail
from runner.spec.yamlfile import Loc

if TYPE_CHECKING:
    from runner.spec.schema import Job

#: the unknown-provider sentence of runner/spec/checks.py: (provider, the installed ones, where it is named)
Unknown = Callable[[str, list[str], str], str]


class PoolEndpoint(Strict):
    """One endpoint of a pool, written as a mapping when the model has another name there."""

    #: a provider (``anthropic``), or a provider and a label (``bedrock:us-east-1``) whose settings are
    #: ``providers: {bedrock:us-east-1: {...}}``, taken over the provider's own
    endpoint: str = Field(min_length=1)
    #: the model's name at this endpoint (a Bedrock id, an Azure deployment); the pooled model's when unset
    model: str | None = None


class Pool(Strict):
    """The endpoints that serve one model (``pools: {provider:model: {endpoints: [...]}}``)."""

    #: the endpoints that serve the model, each a provider or ``provider:label`` (or ``{endpoint:, model:}``): their
    #: limits add up; requests sharing a prompt prefix go to one of them, the rest to the one with the most room; one
    #: that fails (a streak of 5xx or refused connections, a refused key) is taken out and its work goes to the others
    endpoints: list[str | PoolEndpoint]
    #: true: every endpoint serves the same weights, so an answer from any of them is a memo hit for the others (and
    #: endpoints of different providers may pool); false: only endpoints whose answers the memo keys alike may pool
    same_model: bool = False

    def members(self) -> list[PoolEndpoint]:
        return [PoolEndpoint(endpoint=e) if isinstance(e, str) else e for e in self.endpoints]


def provider_of(endpoint: str) -> str:
    """The provider an endpoint label names: ``bedrock`` of ``bedrock:us-east-1``."""
    return endpoint.partition(":")[0]


def labelled(name: str) -> bool:
    """Whether a ``providers:`` key is an endpoint label (``provider:label``) rather than a provider."""
    return ":" in name


def endpoint_settings(job: Job, endpoint: str) -> ProviderSettings:
    """The settings of a pool's endpoint: a provider's own (``providers: {sim: ...}``), or a label's
    (``providers: {sim:b: ...}``) over its provider's."""
    base = job.providers.get(provider_of(endpoint)) or ProviderSettings()
    own = job.providers.get(endpoint) if labelled(endpoint) else None
    if own is None:
        return base
    return ProviderSettings.model_validate({**base.model_dump(exclude_unset=True),
                                            **own.model_dump(exclude_unset=True)})


def has_batch_api(job: Job, endpoint: str) -> bool:
    """Whether an endpoint (a provider, or ``provider:label``) has a Batch API under the job's settings, as its
    provider answers without being built (``Provider.sends_batches``); False for an unknown provider or settings
    it refuses (the job's checks say why)."""
    try:
        return provider_class(provider_of(endpoint)).sends_batches(endpoint_settings(job, endpoint))
    except (KeyError, RunnerError):
        return False


def batch_endpoint(job: Job, model: str) -> PoolEndpoint | None:
    """The endpoint a pooled model's Batch API lines go through: the first of its pool that has a Batch API (the
    first of all when none has: the run then sends them online, or refuses ``mode: batch``); None for a model of no
    pool. A pool's batches are not spread over its endpoints: one endpoint takes them all."""
    pool = job.pools.get(model)
    if pool is None or not pool.endpoints:
        return None
    members = pool.members()
    return next((m for m in members if has_batch_api(job, m.endpoint)), members[0])


def check_pools(job: Job, path: Path, lines: dict[Loc, int], problems: Problems, known: list[str],
                unknown: Unknown) -> None:
    """Each pool's problems, one sentence each at its line: a pool of no model the job asks, an empty list, an
    unknown provider, an endpoint listed twice, a label with no settings, endpoints keyed apart without
    ``same_model: true``."""
    asked = {model for stage in job.llm_stages() for model in job.stage_models(stage)}
    for model, pool in job.pools.items():
        loc: Loc = ("pools", model)
        if model not in asked:
            with problems:
                fail(path, lines, loc, f"no stage asks {model!r}: a pool serves a model of models:")
        if not pool.endpoints:
            with problems:
                fail(path, lines, loc + ("endpoints",), f"the list is empty: name the endpoints that serve {model!r}")
            continue
        seen: set[str] = set()
        families: dict[tuple[str, str], str] = {}
        for index, member in enumerate(pool.members()):
            at: Loc = loc + ("endpoints", index)
            with problems:
                family = _check_member(job, path, lines, at, model, member, known, unknown, seen)
                families.setdefault(family, f"{member.endpoint} ({member.model or split_model(model)[1]})")
        if len(families) > 1 and not pool.same_model:
            with problems:
                named = " and ".join(sorted(families.values()))
                fail(path, lines, loc, f"the memo keys the answers of {named} apart (another provider or model id): "
                                       "add same_model: true if they serve the same weights")


def _check_member(job: Job, path: Path, lines: dict[Loc, int], at: Loc, model: str, member: PoolEndpoint,
                  known: list[str], unknown: Unknown, seen: set[str]) -> tuple[str, str]:
    """One endpoint's problems; its memo family (provider, model id) when it has none."""
    provider = provider_of(member.endpoint)
    if provider not in known:
        fail(path, lines, at, unknown(provider, known, member.endpoint))
    if member.endpoint in seen:  # one limiter, price and ledger label each: another key or region is another label
        fail(path, lines, at, f"endpoint {member.endpoint!r} is listed twice")
    seen.add(member.endpoint)
    served = member.model or split_model(model)[1]
    if labelled(member.endpoint) and member.endpoint not in job.providers:
        fail(path, lines, at, f"endpoint {member.endpoint!r} has no settings: add them under providers: "
                              f"{{{member.endpoint}: {{...}}}} (a base_url, api_key_env, region)")
    settings = job.providers.get(member.endpoint) or job.providers.get(provider)
    try:
        return provider, provider_class(provider).model_id(served, job.endpoints, settings)
    except (KeyError, RunnerError) as exc:
        fail(path, lines, at, str(exc))
