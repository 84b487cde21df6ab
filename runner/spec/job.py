"""Loading a job: a job file (or a mapping) read, its ``${var}``s substituted, built into the schema's models
(runner/spec/schema.py) and checked against the plan and the providers (runner/spec/checks.py); every problem is
a :class:`JobFileError` naming ``file:line`` and the key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from runner.errors import JobFileError
from runner.spec.checks import check_job, validation_context
from runner.spec.problems import JobFileProblems, fail, position
from runner.spec.schema import Job
from runner.spec.variables import substitute_vars
from runner.spec.yamlfile import Loc, dotted, line_of, load_with_lines


def load_job(path: str | Path, overrides: dict[str, str] | None = None) -> Job:
    """Parse, validate and resolve a job file; raise :class:`JobFileError` naming file:line and key.
    ``overrides`` are ``--var name=value`` values, over the file's ``vars:``."""
    path = Path(path)
    data, lines = load_with_lines(path)
    if not isinstance(data, dict):
        raise JobFileError(f"{path}:1: a job file must be a mapping of keys (name, models, stages, ...)")
    return _validated(data, path, lines, overrides, job_path=str(path), base_dir=path.resolve().parent)


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
    return _validated(data, DICT_JOB, {}, overrides, job_path="", base_dir=base)


def _validated(data: dict[str, Any], path: Path, lines: dict[Loc, int], overrides: dict[str, str] | None, *,
               job_path: str, base_dir: Path) -> Job:
    data = substitute_vars(path, lines, data, overrides or {})
    for reserved in ("path", "base_dir"):
        if reserved in data:
            fail(path, lines, (reserved,), f"unknown key {reserved!r}")
    try:
        job = Job.model_validate(data, context=validation_context())
    except ValidationError as exc:
        raise _all_errors(path, lines, exc) from None
    job.path = job_path
    job.base_dir = str(base_dir)
    check_job(job, path, lines)
    return job


def _all_errors(path: Path, lines: dict[Loc, int], exc: ValidationError) -> JobFileProblems:
    """Every problem pydantic found, one ``file:line: key: what`` each, in the file's order."""
    errors = exc.errors(include_url=False)
    # A prompt written as a mapping also fails the plain-string branch of its union: report the other.
    errors = [e for e in errors if not (e["loc"][-1:] == ("str",) and e["type"] == "string_type")] or errors
    # A misspelt key shows up both as unknown and as a missing required one: the typo is the news.
    typos: set[tuple[Loc, str]] = set()
    found: list[tuple[int, int, str]] = []
    for error in sorted(errors, key=lambda e: e["type"] != "extra_forbidden"):
        loc = _clean_loc(error["loc"])
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
    return JobFileProblems(path, [text for _, _, text in sorted(found)])


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
