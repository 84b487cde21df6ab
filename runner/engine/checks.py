"""What is checked and said before a run sends anything: every provider has its key, a budget has its prices and
bounds, log-likelihood stages have providers that score, the results folders can be written, a job can be split
between workers (``runner work``); the warnings a front door shows before a run; the stored job of a run to
resume. :func:`runner.engine.run.execute` makes the checks; :mod:`runner.service` says the rest."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from runner.engine.budget import budgets_of
from runner.engine.endpoints import connection_pool_size
from runner.engine.tiers import check_tier_prices
from runner.errors import OutputError, RunnerError, StoreError
from runner.providers.base import Provider, ProviderSettings, provider_class, split_model
from runner.spec.pools import batch_endpoint, endpoint_settings, provider_of
from runner.spec.schema import Job
from runner.store import Store


def check_output(job: Job) -> None:
    """Before a run is made: each folder its results go to can be created and written, or one sentence names it."""
    folders = {Path(job.output_dir) / job.name}
    folders.update(Path(stage.output).parent for stage in job.llm_stages() if stage.output)
    for folder in sorted(folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"the output folder {folder} cannot be created ({exc.strerror or exc}): set output_dir"
                              f" (or the stage's output:) in {job.path or 'the job file'} to a folder that can be",
                              folder) from None
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise OutputError(f"the output folder {folder} cannot be written ({exc.strerror or exc}): make it "
                              f"writable, or set output_dir (or the stage's output:) in {job.path or 'the job file'}"
                              " to another folder", folder) from None


def job_models(job: Job) -> list[str]:
    return sorted({model for stage in job.stages for model in job.stage_models(stage)})


def build_providers(job: Job) -> dict[str, Provider]:
    """One provider object per provider the job names (not started: that waits for a cache miss), after
    checking that each has its SDK installed and the key it needs, so a missing package or variable stops the job
    before any request. Each is handed its settings (and its ``endpoints:`` entries') with the connection pool its
    SDK clients need for what the engine lets go to one endpoint at once, the job's ``max_in_flight`` included
    (:func:`~runner.engine.endpoints.connection_pool_size`)."""

    def sized(settings: ProviderSettings) -> ProviderSettings:
        return settings.with_pool_size(connection_pool_size(settings, job.max_in_flight))

    endpoints = {label: sized(settings) for label, settings in job.endpoints.items()}
    providers: dict[str, Provider] = {}
    for model in job_models(job):
        name, model_name = split_model(model)
        provider = providers.get(name)
        if provider is None:
            provider = providers[name] = provider_class(name)(sized(job.providers.get(name) or ProviderSettings()),
                                                              endpoints)
        provider.check_sdk(model_name)
        provider.check_key(model_name)
    for model, pool in job.pools.items():  # each endpoint of a pool: its own provider object and settings
        for member in pool.members():
            name = provider_of(member.endpoint)
            provider = providers.get(member.endpoint)
            if provider is None:
                provider = providers[member.endpoint] = provider_class(name)(
                    sized(endpoint_settings(job, member.endpoint)), endpoints)
            served = member.model or split_model(model)[1]
            provider.check_sdk(served)
            provider.check_key(served)
    return providers


class NotJoinable(RunnerError):
    """``runner work`` on a job whose stages cannot be split between processes."""

    exit_code = 2


def check_joinable(job: Job) -> None:
    """Workers split evaluation stages sent online; a pipeline's stages depend on each other's rows and a Batch
    API stage is one process's batches."""
    if job.is_pipeline:
        raise NotJoinable(f"job {job.name} is a pipeline: its stages run in one process; `runner work` joins jobs "
                          "whose stages are all evaluations")
    for stage in job.llm_stages():
        if job.stage_mode(stage) != "online":
            raise NotJoinable(f"stage {stage.name} of job {job.name} uses a Batch API (mode: {job.stage_mode(stage)})"
                              ": its batches belong to the process that submitted them; `runner work` joins online "
                              "stages")


def check_prices(job: Job) -> None:
    """A budget needs every model's price and a bound on output tokens; refuse to start without them."""
    from runner.providers.pricing import Pricing

    if budgets_of(job) is None:
        return
    pricing = Pricing(job)
    where = job.path or "the job file"
    for model in job_models(job):
        if not pricing.known(model):
            raise RunnerError(f"{where}: the price of {model} is unknown and the job has a budget: add "
                              f"prices: {{{model}: {{input: USD, output: USD}}}} (per million tokens)")
    for stage in job.llm_stages():
        if any(job.model_params(stage, model).get("max_tokens") is None for model in job.stage_models(stage)):
            raise RunnerError(f"{where}: stage {stage.name} has no params.max_tokens, and a budget needs a bound "
                              "on output tokens to reserve a request's worst case")


class BatchModeError(RunnerError):
    """A stage asks for ``mode: batch`` with a model whose provider has no Batch API."""

    exit_code = 2


def check_batch_modes(job: Job, providers: dict[str, Provider]) -> None:
    """``mode: batch`` needs every model of the stage to have a Batch API; say which does not."""
    for stage in job.llm_stages():
        if job.stage_mode(stage) != "batch":
            continue
        for model in job.stage_models(stage):
            name, _, served = model.partition(":")
            via = batch_endpoint(job, model)  # a pooled model's batches go through one endpoint of its pool
            if via is not None:
                name, served = via.endpoint, via.model or served
            provider = providers[name]
            if not getattr(provider, "supports_batch", False):
                reason = provider.batch_unavailable(served)
                if reason:  # a provider with a Batch API that this job's settings leave out says what to set
                    raise BatchModeError(f"{job.path or 'the job file'}: stage {stage.name}: {reason}")
                raise BatchModeError(
                    f"{job.path or 'the job file'}: stage {stage.name} has mode: batch, but {model} has no Batch "
                    "API (OpenAI, Anthropic, Gemini, Azure OpenAI, Vertex AI, Bedrock and sim: have one): set mode: "
                    "auto (batch where there is one, online elsewhere) or mode: online for that stage")


class CannotScore(RunnerError):
    """A ``parse: loglikelihood`` stage names a model whose provider returns no log-probabilities."""

    exit_code = 2


def check_loglikelihood(job: Job) -> None:
    """Log-likelihood stages need providers that can score (``Provider.supports_loglikelihood``, a property of
    the provider's class: no SDK or key is needed to tell); a chat-only API is named before anything is sent, and
    at ``runner validate`` and ``runner estimate``."""
    if (problem := loglikelihood_problem(job)) is not None:
        raise CannotScore(problem)


def loglikelihood_problem(job: Job) -> str | None:
    """The sentence :func:`check_loglikelihood` raises, or None."""
    for stage in job.llm_stages():
        if stage.parse != "loglikelihood":
            continue
        for model in job.stage_models(stage):
            if not provider_class(split_model(model)[0]).supports_loglikelihood:
                return (f"{job.path or 'the job file'}: stage {stage.name} scores log-likelihoods, and {model} "
                        "cannot score log-likelihoods (a chat-only API): use a local: model or an "
                        "openai-compatible: completions server there, and give chat models to a stage in the prompt "
                        "form")
    return None


def budget_warnings(job: Job) -> list[str]:
    """Said before a run with priced models and no budget: nothing bounds what it may spend."""
    from runner.providers.pricing import Pricing

    pricing = Pricing(job)
    unknown = [model for model in job_models(job) if not pricing.known(model)]
    lines = [f"warning: no price is known for {model}; its cost is counted as 0: add prices: {{{model}: "
             "{input: USD, output: USD}} (per million tokens) to count it" for model in unknown]
    if budgets_of(job) is not None:
        return lines
    priced = [model for model in job_models(job) if (rates := pricing.rates(model)) is not None and not rates.is_free]
    if priced:
        lines.append(f"warning: no budget is set for {', '.join(priced)}; add budget: {{usd: N}} to the job or "
                     "`--budget USD` to cap what this run may spend")
    return lines


def dataset_warnings(job: Job) -> list[str]:
    """Said before a run whose stage reads a dataset with no rows (the stage sends nothing; the run still ends),
    or whose rows have a ``gold`` field the stage does not name (it is not scored: a stage is scored only when the
    job says what its gold is)."""
    from runner.plan.stage import count_rows, iter_rows

    lines = []
    for stage in job.stages:
        if stage.dataset is None:
            continue
        if count_rows(stage.dataset, 1) == 0:
            lines.append(f"warning: stage {stage.name}: the dataset {stage.dataset.path} has no rows, so the stage "
                         "has nothing to send")
            continue
        if stage.is_llm and not stage.review and _unnamed_gold(stage):
            key = "choices.gold" if stage.choices is not None else "gold"
            first = next(iter_rows(stage.dataset, 1), (0, {}))[1]
            if "gold" in first:
                lines.append(f"warning: stage {stage.name} is not scored: its rows have a 'gold' field but the stage "
                             f"names no gold; add {key}: gold to score it")
    return lines


def _unnamed_gold(stage: Any) -> bool:
    return (stage.choices.gold if stage.choices is not None else stage.gold) is None


def load_run_job(store: Store, run_id: str) -> tuple[dict[str, Any], Job]:
    """The job a run was started with, as it was then (the file may have changed since)."""
    run = store.get_run(run_id)
    if run["status"] == "completed":
        raise StoreError(f"run {run['id']} is already completed; `runner report {run['id']}` shows it")
    try:
        return run, Job.model_validate_json(run["job_json"])
    except ValueError as exc:
        raise StoreError(f"run {run['id']} has a stored job this version cannot read ({exc})") from None


def check_before_sending(job: Job) -> dict[str, Provider]:
    """The job's providers (not started), once every check that needs no request has passed: keys, prices for a
    budget and for the service tiers asked, Batch API modes, log-likelihood scoring, the results folders (said before
    the run row is made)."""
    providers = build_providers(job)
    check_prices(job)
    check_tier_prices(job)
    check_batch_modes(job, providers)
    check_loglikelihood(job)
    check_output(job)
    return providers
