"""A job's service tiers checked before anything is sent: each model asked for a tier is sold at it (the capability
table's ``TIER_RULES``, read by runner/providers/tiers.py, each rule with its source), ``fallback:`` has flex
requests to fall back from, a ``tier:`` mapping names models its stage runs, and a tier other than standard asks
online requests only (a Batch API line has the Batch API's price; a log-likelihood request no tier). Run by
runner/spec/checks.py; each problem is said at its key's line, all of them together."""

from __future__ import annotations

from pathlib import Path

from runner.errors import RunnerError
from runner.providers.base import provider_class, split_model
from runner.providers.tiers import STANDARD, tier_problem
from runner.spec.problems import Problems, fail
from runner.spec.schema import Job
from runner.spec.stage import Stage
from runner.spec.yamlfile import Loc


def check_tiers(job: Job, path: Path, lines: dict[Loc, int], problems: Problems) -> None:
    """Every problem of the job's ``tier:`` and ``fallback:`` settings, recorded in ``problems``."""
    run_anywhere: set[str] = set()
    flex_anywhere = False
    for s, stage in enumerate(job.stages):
        if not stage.is_llm:
            continue
        loc: Loc = ("stages", s)
        models = job.stage_models(stage)
        run_anywhere.update(models)
        if isinstance(stage.tier, dict):
            for name in stage.tier:
                if name not in models:
                    with problems:
                        fail(path, lines, loc + ("tier", name), f"tier: names {name!r}, which stage {stage.name!r} "
                                                                f"does not run (it runs {', '.join(models)})")
        asked = {model: tier for model in models if (tier := job.stage_tier(stage, model)) is not None}
        flex = [model for model, tier in asked.items() if tier == "flex"]
        flex_anywhere = flex_anywhere or bool(flex)
        if stage.fallback is not None and not flex:
            with problems:
                fail(path, lines, loc + ("fallback",), f"fallback: {stage.fallback} is where a flex request the "
                                                       "provider sheds is sent; it needs tier: flex for a model of "
                                                       f"stage {stage.name!r}, which sends none at flex")
        for model, tier in asked.items():
            where = _where(job, stage, loc, model)
            if tier != STANDARD and job.stage_mode(stage) != "online":
                with problems:
                    fail(path, lines, where, f"tier: {tier} is a tier of online requests, and stage {stage.name!r} "
                                             f"has mode: {job.stage_mode(stage)} (a Batch API line has the Batch "
                                             "API's price): set mode: online for it, or remove tier:")
            elif tier != STANDARD and stage.parse == "loglikelihood":
                with problems:
                    fail(path, lines, where, f"tier: {tier} does not apply to parse: loglikelihood (scored through "
                                             "the completions endpoint, which sells no tier): remove tier:")
            elif (problem := _model_problem(job, model, tier)) is not None:
                with problems:
                    fail(path, lines, where, problem)
    if isinstance(job.tier, dict):
        for name in job.tier:
            if name not in run_anywhere:
                with problems:
                    fail(path, lines, ("tier", name), f"tier: names {name!r}, which no stage runs")
    if job.fallback is not None and not flex_anywhere:
        with problems:
            fail(path, lines, ("fallback",), f"fallback: {job.fallback} is where a flex request the provider sheds is "
                                             "sent; it needs tier: flex, and no stage sends a request at flex")


def _where(job: Job, stage: Stage, loc: Loc, model: str) -> Loc:
    """The key that sets ``model``'s tier in ``stage``: the stage's ``tier:`` (or its entry), else the job's."""
    for setting, at in ((stage.tier, loc + ("tier",)), (job.tier, ("tier",))):
        if isinstance(setting, dict) and model in setting:
            return at + (model,)
        if isinstance(setting, str):
            return at
    return loc


def _model_problem(job: Job, model: str, tier: str) -> str | None:
    """Why ``model`` (``provider:name`` as the job writes it) cannot be sent at ``tier``, or None: read under the
    model its name serves (an Azure deployment's) and the API version the job's settings send."""
    try:
        provider, name = split_model(model)
        settings = job.providers.get(provider)
        cls = provider_class(provider)
        behind, api_version = cls.model_behind(name, settings), cls.api_version_of(settings)
    except (KeyError, ValueError, RunnerError):  # a malformed model or an unknown provider: said where it is named
        return None
    return tier_problem(provider, behind, tier, api_version=api_version, label=model)
