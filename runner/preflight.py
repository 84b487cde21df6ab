"""Pre-flight: every model a job names asked once, concurrently, with its API's cheapest call (``Provider.probe``: a
model lookup or a models list), before any paid request. ``runner check JOB`` prints the answers; ``runner submit``
and ``run_job`` stop on them (``runner/service.py``) unless told not to check.

A probe costs nothing and records nothing: no budget is reserved, no memo or store row is written, and the simulated
server does not count it as a model request. Each failure is one sentence naming ``provider:model``: an endpoint
that cannot be reached (with the question whether it runs), a refused key (with its variable), an unknown model,
deployment, project or region (with what to fix), a missing key or SDK (as the run would say it).

A pooled model (``pools:``) is asked at every endpoint of its pool, each with its own settings (key, region, base
URL) and its name there: one answer per endpoint, named ``provider:model at LABEL``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from runner.errors import ModelSetupError, RunnerError, TransientError
from runner.providers.base import Provider, ProviderSettings, provider_class, split_model
from runner.spec.pools import endpoint_settings, provider_of
from runner.spec.schema import Job

#: seconds each probe may take (each start, then each lookup) when neither ``--timeout`` nor the variable says
DEFAULT_TIMEOUT = 3.0
#: the environment variable giving the probes' timeout in seconds (a slow models endpoint)
TIMEOUT_VARIABLE = "RUNNER_CHECK_TIMEOUT"
#: TransientError classes that mean nothing answered
_UNREACHABLE = ("connection", "timeout")


@dataclass(frozen=True, slots=True)
class Probe:
    """One model's answer (a pooled model's: one endpoint's): ``problem`` is the sentence saying what is wrong, None
    when the endpoint answered well."""

    #: ``provider:model``, or ``provider:model at LABEL`` for an endpoint of its pool
    model: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class PreflightFailed(ModelSetupError):
    """Some models failed the pre-flight check: nothing was sent. ``problems`` holds one sentence per model (the
    CLI prints each on its line, then ``summary``)."""

    def __init__(self, failed: list[Probe], total: int, skip: str) -> None:
        self.problems = [probe.problem for probe in failed if probe.problem is not None]
        self.summary = (f"{len(failed)} of {total} model(s) failed the pre-flight check, so no request was sent "
                        f"({skip} skips the check)")
        super().__init__(self.problems[0] + f"; no request was sent ({skip} skips the check)"
                         if len(self.problems) == 1 else self.summary)


def timeout_setting(timeout: float | None = None) -> float:
    """The probes' timeout: ``timeout`` when given, else ``RUNNER_CHECK_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""
    if timeout is None:
        text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
        if not text:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(text)
        except ValueError:
            raise RunnerError(f"{TIMEOUT_VARIABLE} must be a number of seconds, not {text!r}") from None
    if not timeout > 0:
        raise RunnerError(f"the pre-flight check's timeout must be more than 0 seconds (got {timeout:g})")
    return float(timeout)


def job_models(job: Job) -> list[str]:
    """Every ``provider:model`` the job's stages name, once, in order."""
    return sorted({model for stage in job.stages for model in job.stage_models(stage)})


def sentence(model: str, exc: BaseException) -> str:
    """A failure as one line naming the model: the error's own words, with the question an unreachable endpoint
    raises."""
    text = str(exc).strip() or type(exc).__name__
    if not text.startswith(model):
        text = f"{model}: {text}"
    if isinstance(exc, TransientError) and exc.error_class in _UNREACHABLE and "running?" not in text:
        text += ": is the server running?"
    return text


def _with_timeout(settings: ProviderSettings, timeout: float) -> ProviderSettings:
    """The settings with the SDK's own timeout at most the probe's, so a hung endpoint says where it is."""
    return settings.model_copy(update={"timeout": min(settings.timeout, timeout)})


async def _bounded(step: Coroutine[Any, Any, None], timeout: float) -> Exception | None:
    """Await ``step`` (a start or a probe) within ``timeout`` (and a little more, so that the SDK's own timeout,
    which names the endpoint, speaks first); what it failed with, or None."""
    try:
        await asyncio.wait_for(step, timeout + 1.0)
    except TimeoutError:
        return TransientError(f"no answer within {timeout:g} s: is the server running? ({TIMEOUT_VARIABLE}=SECONDS "
                              "gives a slow endpoint longer)", error_class="timeout")
    except Exception as exc:  # a provider's bug or an SDK error it did not map: still one line, for its model
        return exc if isinstance(exc, RunnerError) else RunnerError(f"the check failed with {type(exc).__name__}: "
                                                                    f"{exc}")
    return None


async def probe_models(job: Job, models: Iterable[str] | None = None, *, timeout: float | None = None) -> list[Probe]:
    """Probe ``models`` (every model of ``job`` by default) concurrently: one :class:`Probe` per model, in order.
    Each provider is built as the run builds it (its SDK and key checked first), started, asked once per model,
    and closed."""
    seconds = timeout_setting(timeout)
    names = [target for model in dict.fromkeys(models if models is not None else job_models(job))
             for target in _targets(job, model)]
    problems: dict[str, str] = {}
    providers: dict[str, Provider] = {}
    users: dict[str, list[tuple[str, str]]] = {}  # provider key -> (what is probed, model) to probe
    endpoints = {label: _with_timeout(settings, seconds) for label, settings in job.endpoints.items()}
    for model, key, model_name in names:
        try:
            provider = providers.get(key)
            if provider is None:
                settings = _with_timeout(endpoint_settings(job, key), seconds)
                provider = providers[key] = provider_class(provider_of(key))(settings, endpoints)
            provider.check_sdk(model_name)
            provider.check_key(model_name)
        except (RunnerError, KeyError) as exc:
            problems[model] = sentence(model, exc)
            continue
        users.setdefault(key, []).append((model, model_name))
    try:
        started = await asyncio.gather(*(_bounded(providers[name].start(), seconds) for name in users))
        asks: list[tuple[str, Coroutine[Any, Any, None]]] = []
        for (name, probes), failed in zip(users.items(), started, strict=True):
            for model, model_name in probes:
                if failed is not None:  # a provider that cannot start fails each of its models the same way
                    problems[model] = sentence(model, failed)
                else:
                    asks.append((model, providers[name].probe(model_name)))
        answers = await asyncio.gather(*(_bounded(ask, seconds) for _, ask in asks))
        problems.update({model: sentence(model, answer) for (model, _), answer in zip(asks, answers, strict=True)
                         if answer is not None})
    finally:
        for provider in providers.values():
            try:
                await provider.aclose()
            except Exception:  # noqa: S110 - closing a probe's client must not hide what the probe found
                pass
    return [Probe(model, problems.get(model)) for model, _, _ in names]


def _targets(job: Job, model: str) -> list[tuple[str, str, str]]:
    """What to probe for ``model``: (what the answer names, the provider's key, the model's name there): its
    provider's endpoint, or each endpoint of its pool under its label."""
    name, model_name = split_model(model)
    pool = job.pools.get(model)
    if pool is None or not pool.endpoints:
        return [(model, name, model_name)]
    return [(f"{model} at {m.endpoint}", m.endpoint, m.model or model_name) for m in pool.members()]


async def require(job: Job, models: Iterable[str] | None = None, *, timeout: float | None = None,
                  skip: str = "--no-check") -> None:
    """Probe ``models`` (every model of ``job`` by default); raise :class:`PreflightFailed` (every failure, one
    sentence each) when any failed. ``skip`` names the setting that turns the check off, as the front door spells
    it."""
    results = await probe_models(job, models, timeout=timeout)
    failed = [probe for probe in results if not probe.ok]
    if failed:
        raise PreflightFailed(failed, len(results), skip)


def lines(results: list[Probe]) -> list[str]:
    """``runner check``'s output: one line per model, ``ok`` or ``failed`` and the sentence."""
    return [f"ok      {probe.model}" if probe.ok else f"failed  {probe.problem}" for probe in results]
