"""Parsers and scorers of one's own, named by a job without editing the package.

A stage names one by import path, ``parse: mypackage.answers:read_answer`` and ``scorer: mypackage.answers:close``,
or by the name an installed package registers under the entry-point groups ``llm_job_runner.parsers`` and
``llm_job_runner.scorers`` (``scorer: close_enough``). An import path is looked up first in the job file's folder,
then on Python's path, so a ``myparsers.py`` beside the job needs no install.

A parser is ``fn(answer: str, *, options: list[str], row: dict) -> value``:

- ``answer`` is the model's text (its thinking is not in it); ``options`` the options in the order the prompt
  showed them (empty without ``choices:``); ``row`` the dataset row the answer belongs to;
- it returns the parsed value, which is stored as ``parsed`` and handed to the scorer; with ``choices:`` it returns
  the index of the chosen option *in the shown order* (an ``int``), which the runner maps back to the original
  order as it does for letters;
- it returns ``None`` when the answer holds no answer, or raises ``ValueError("why")``: the answer is invalid
  (``invalid_reason`` says why) and scored wrong. Any other exception is a bug in the parser: the answer is kept,
  marked invalid with the exception named, and the run says so once.

A scorer is ``fn(parsed, gold) -> float`` (1.0 right, 0.0 wrong, or partial credit in between; ``True``/``False``
count as 1/0), called only for valid answers of tasks with a gold (an invalid answer scores 0 without a call), as
the built-in ones in :mod:`runner.evaluate.scorers`.

Loading a plug-in runs its module's code: a job names its own code, as a Python script would.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from runner.errors import RunnerError

PARSER_GROUP = "llm_job_runner.parsers"
SCORER_GROUP = "llm_job_runner.scorers"


class PluginError(RunnerError):
    """A parser or scorer a job names cannot be loaded (no such module or function, or not callable)."""

    exit_code = 2


def is_import_path(name: str) -> bool:
    """``package.module:function``: the one form of a name that is an import path."""
    module, colon, function = name.partition(":")
    return bool(colon and module and function)


@cache
def entry_point_names(group: str) -> frozenset[str]:
    """The names installed packages register under an entry-point group (read once per process)."""
    return frozenset(ep.name for ep in importlib.metadata.entry_points(group=group))


#: what each (name, group) loaded to in this process: the job's check or a stage's plan loads a plug-in from the
#: job's folder, and parsing the answers later finds it here
_loaded: dict[tuple[str, str], Callable[..., Any]] = {}


def load(name: str, group: str, folder: str | Path | None = None) -> Callable[..., Any]:
    """The callable ``name`` names: an import path (looked up in ``folder`` first), else an entry point of
    ``group``; once loaded, the same callable whatever the folder. Raises PluginError in one sentence."""
    found = _loaded.get((name, group))
    if found is None:
        found = _loaded[(name, group)] = _load(name, group, str(folder) if folder else None)
    return found


def load_stage_plugins(stage: Any, folder: str | Path | None) -> None:
    """Load a stage's own parser and scorer (a ``runner.spec.stage.Stage``), so its answers can be read."""
    if stage.parse_plugin:
        load(stage.parse, PARSER_GROUP, folder)
    if stage.scorer is not None:
        load(stage.scorer, SCORER_GROUP, folder)


def _load(name: str, group: str, folder: str | None) -> Callable[..., Any]:
    what = "parser" if group == PARSER_GROUP else "scorer"
    if not is_import_path(name):
        found = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
        if not found:
            raise PluginError(f"no {what} named {name!r}: name one by import path (package.module:function) or "
                              f"install a package that registers it under the entry-point group {group!r}")
        try:
            fn = found[0].load()
        except Exception as exc:  # the plug-in's own import failed
            raise PluginError(f"the {what} {name!r} (entry point {found[0].value}) could not be loaded: "
                              f"{type(exc).__name__}: {exc}") from None
    else:
        module_name, _, attribute = name.partition(":")
        module = _import(module_name, folder, what, name)
        fn = module
        for part in attribute.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                raise PluginError(f"the {what} {name!r}: module {module_name!r} has no {attribute!r}")
    if not callable(fn):
        raise PluginError(f"the {what} {name!r} is not a function (it is a {type(fn).__name__})")
    return fn


def _import(module_name: str, folder: str | None, what: str, name: str) -> Any:
    added = folder is not None and folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            where = f"in {folder} or " if folder else ""
            raise PluginError(f"the {what} {name!r}: no module named {module_name!r} {where}on Python's path") from None
        raise PluginError(f"the {what} {name!r} could not be imported: {exc}") from None
    except Exception as exc:  # the plug-in's module fails on import
        raise PluginError(f"the {what} {name!r} could not be imported: {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(folder)


def call_parser(fn: Callable[..., Any], answer: str, options: list[str], row: dict[str, Any]
                ) -> tuple[Any, str | None]:
    """(value, None) for an answer read, or (None, why) for one with no answer in it. A parser's bug (any
    exception other than ValueError) propagates: the caller keeps the answer and says so."""
    try:
        value = fn(answer, options=options, row=row)
    except ValueError as exc:
        return None, str(exc) or "the parser found no answer"
    if value is None:
        return None, "the parser found no answer"
    return value, None


def call_scorer(fn: Callable[..., Any], parsed: Any, gold: Any) -> float:
    """A plug-in scorer's score, checked: a number from 0 to 1 (a bool counts as 1 or 0)."""
    value = fn(parsed, gold)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"a scorer must return a number from 0 to 1, not {value!r}")
    return float(value)
