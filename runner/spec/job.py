"""Loading a job: a job file (or a mapping) read, its ``${var}``s substituted, built into the schema's models
(runner/spec/schema.py) and checked against the plan and the providers (runner/spec/checks.py); every problem is
a :class:`JobFileError` naming ``file:line`` and the key."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from runner.errors import JobFileError
from runner.plan.datasets import folder_problem
from runner.spec.checks import check_job, validation_context
from runner.spec.files import find_file
from runner.spec.inputs import Choices, Dataset
from runner.spec.problems import JobFileProblems, position
from runner.spec.schema import Job
from runner.spec.variables import substitute_vars
from runner.spec.yamlfile import Loc, dotted, line_of, load_with_lines


def load_job(path: str | Path, overrides: dict[str, str] | None = None) -> Job:
    """Parse, validate and resolve a job file; raise :class:`JobFileError` naming file:line and key.
    ``overrides`` are ``--var name=value`` values, over the file's ``vars:``."""
    return examine_job(path, overrides).passed()


def examine_job(path: str | Path, overrides: dict[str, str] | None = None) -> Examined:
    """A job file validated as :func:`load_job` does, every problem gathered instead of raised; what could not be
    read as YAML at all is still raised (a JobFileError: there is nothing more to say about it)."""
    path = Path(path)
    data, lines = load_with_lines(path)
    if not isinstance(data, dict):
        raise JobFileError(f"{path}:1: a job file must be a mapping of keys (name, models, stages, ...)")
    return _examined(data, path, lines, overrides, job_path=str(path), base_dir=path.resolve().parent)


#: what errors in a job given as a mapping (:func:`job_from_dict`) name instead of ``file:line``
DICT_JOB = Path("job dict")


def job_from_dict(data: dict[str, Any], overrides: dict[str, str] | None = None,
                  base_dir: str | Path | None = None) -> Job:
    """A job given as a mapping (a job file's content, from Python): validated as :func:`load_job` does, with
    errors naming the key (``job dict: stages[0].prompt: ...``), and relative paths (datasets, prompts) looked up
    from ``base_dir`` (default: the working directory). The mapping is not changed."""
    if not isinstance(data, dict):
        raise JobFileError(f"{DICT_JOB}: a job must be a mapping of keys (name, models, stages, ...), "
                           f"not {type(data).__name__}")
    base = Path(base_dir).expanduser().resolve() if base_dir is not None else Path.cwd()
    return _examined(data, DICT_JOB, {}, overrides, job_path="", base_dir=base).passed()


ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass
class Examined:
    """A job file examined: its problems, each ``file:line: key: what`` in the file's order, and the job when it
    has none. Also what ``runner validate`` needs to read the datasets of a job that has problems."""

    path: Path
    problems: list[str]
    #: the job, built and checked; None when it has a problem
    job: Job | None
    #: the file's data with its ``${name}``s replaced where they could be
    data: dict[str, Any]
    #: the keys whose strings still hold a ``${name}`` that could not be replaced
    broken: set[Loc]
    base_dir: Path

    def passed(self) -> Job:
        """The job; :class:`JobFileProblems` with every problem when it has any."""
        if self.problems:
            raise JobFileProblems(self.path, self.problems)
        assert self.job is not None  # a job without problems is built
        return self.job

    def readable_datasets(self) -> list[tuple[Dataset, Choices | None, int | None, str | None]]:
        """(dataset, its options when the stage chooses among some, the rows to read at most, the stage's
        ``cluster:`` field) of each stage whose dataset can be read despite the job's problems: its ``dataset:``
        (and ``choices:``, else the options are left unchecked) valid and without an unfilled ``${name}``, and the
        file there. Paths are resolved."""
        if self.job is not None:
            return [(s.dataset, s.choices if s.is_llm else None, self.job.stage_limit(s), s.cluster)
                    for s in self.job.stages if s.dataset is not None]
        limit = self.data.get("limit")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1 or self._broken(("limit",)):
            limit = None
        stages = self.data.get("stages")
        found: list[tuple[Dataset, Choices | None, int | None, str | None]] = []
        for index, raw in enumerate(stages if isinstance(stages, list) else []):
            if not isinstance(raw, dict) or self._broken(("stages", index, "dataset")):
                continue
            dataset = self._valid(Dataset, raw.get("dataset"))
            choices = self._valid(Choices, raw.get("choices")) if raw.get("prompt") is not None \
                and not self._broken(("stages", index, "choices")) else None
            where = find_file(self.base_dir, dataset.path, folder=True) if dataset is not None else None
            if dataset is None or where is None or (where.is_dir() and folder_problem(where, dataset.format)):
                continue
            dataset.path = str(where)
            if choices is not None and choices.options_file is not None:
                options = find_file(self.base_dir, choices.options_file)
                choices = choices.model_copy(update={"options_file": str(options)}) if options else None
            limits = [n for n in (limit, dataset.limit) if n is not None]
            cluster = raw.get("cluster") if isinstance(raw.get("cluster"), str) and raw.get("cluster") else None
            found.append((dataset, choices, min(limits) if limits else None, cluster))
        return found

    def _broken(self, loc: Loc) -> bool:
        return any(broken[:len(loc)] == loc for broken in self.broken)

    @staticmethod
    def _valid(model: type[ModelT], raw: Any) -> ModelT | None:
        if not isinstance(raw, dict):
            return None
        try:
            return model.model_validate(raw, context=validation_context())
        except ValidationError:
            return None


def _examined(data: dict[str, Any], path: Path, lines: dict[Loc, int], overrides: dict[str, str] | None, *,
              job_path: str, base_dir: Path) -> Examined:
    substituted = substitute_vars(path, lines, data, overrides or {})
    data, problems = substituted.data, list(substituted.problems)
    for reserved in ("path", "base_dir"):
        if reserved in data:
            problems.append(f"{position(path, lines, (reserved,))}: {reserved}: unknown key {reserved!r}")
    job: Job | None = None
    try:
        job = Job.model_validate({k: v for k, v in data.items() if k not in ("path", "base_dir")},
                                 context=validation_context())
    except ValidationError as exc:
        problems += _all_errors(path, lines, exc, substituted.broken)
    if job is not None:
        job.path = job_path
        job.base_dir = str(base_dir)
    if job is not None and not problems:  # a job with a var left unfilled is not checked further: it is not the job
        try:
            check_job(job, path, lines)
        except JobFileProblems as exc:
            problems += exc.problems
        except JobFileError as exc:
            problems.append(str(exc))
    problems.sort(key=lambda problem: _line_in(path, problem))  # stable: in the file's order, then as found
    return Examined(path, problems, None if problems else job, data, substituted.broken, base_dir)


def _line_in(path: Path, problem: str) -> int:
    """The line a problem names (``file:line: ...``); 0 for one that names none (a ``--var``)."""
    rest = problem.removeprefix(f"{path}:")
    digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
    return int(digits) if rest != problem and digits else 0


def _all_errors(path: Path, lines: dict[Loc, int], exc: ValidationError, broken: set[Loc]) -> list[str]:
    """Every problem pydantic found, one ``file:line: key: what`` each, in the file's order; none at or under a key
    in ``broken`` (a string whose ``${name}`` could not be filled in: that is its problem)."""
    errors = exc.errors(include_url=False)
    # A prompt written as a mapping also fails the plain-string branch of its union: report the other.
    errors = [e for e in errors if not (e["loc"][-1:] == ("str",) and e["type"] == "string_type")] or errors
    # A misspelt key shows up both as unknown and as a missing required one: the typo is the news.
    typos: set[tuple[Loc, str]] = set()
    found: list[tuple[int, int, str]] = []
    for error in sorted(errors, key=lambda e: e["type"] != "extra_forbidden"):
        loc = _clean_loc(error["loc"])
        if any(loc[:len(key)] == key for key in broken):
            continue
        kind = error["type"]
        if kind == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}"
            close = difflib.get_close_matches(str(loc[-1]), _allowed_keys(loc[:-1]), n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
                typos.add((loc[:-1], close[0]))
        elif kind == "missing":
            if (loc[:-1], str(loc[-1])) in typos:
                continue
            message = f"required key {loc[-1]!r} is missing"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if not isinstance(error.get("input"), dict | list):
                message += f" (got {error.get('input')!r})"
        text = f"{position(path, lines, loc)}: {dotted(loc) or 'job'}: {message}"
        if all(text != seen for _, _, seen in found):
            found.append((line_of(lines, loc), len(found), text))
    return [text for _, _, text in sorted(found)]


def _allowed_keys(loc: Loc) -> list[str]:
    """The keys a mapping at ``loc`` may have, for "did you mean" hints."""
    model: type[BaseModel] | None = Job
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part)) or model.model_fields.get(f"{part}_")
        if field is None:
            return []
        model = _model_of(field.annotation)
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _clean_loc(loc: tuple[Any, ...]) -> Loc:
    # pydantic adds union branch names ("str", "InlinePrompt") to locations; they are not keys of the file
    # (a model with an after-validator shows as "function-after[_one_form(), InlinePrompt]")
    return tuple(part for part in loc if isinstance(part, int)
                 or (part not in {"str", "InlinePrompt"} and not str(part).startswith("function-")))
