"""Named Python steps for pipelines: parsers that turn one answer into items, and steps that turn rows into
rows. A job names them (``parse: newterm.coma_paragraphs``, ``recipe: newterm.related_terms``); anything a
YAML data step cannot say is written here.

A parser is ``fn(text, row, args) -> Parsed``: the items it found in one answer, and how many pieces it
rejected under each rule (for the funnel report). A step is ``fn(rows, args, ctx) -> Outcome``: the rows it
keeps or makes, and how many it dropped under each rule.

The source text of a recipe's module is part of the content address of every stage that uses it: editing a
recipe re-runs what depends on it.
"""

from __future__ import annotations

import importlib
import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: modules whose recipes are registered on first use
MODULES = ("runner.recipes.newterm", "runner.recipes.winodict")


@dataclass
class Parsed:
    """What a parser found in one answer: its items (strings or dicts) and the pieces it rejected, by rule."""

    items: list[Any]
    rejected: Counter[str] = field(default_factory=Counter)


@dataclass
class Outcome:
    """What a step made of its input rows: the rows it keeps (or builds), and the rows it dropped, by rule."""

    rows: list[dict[str, Any]]
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass
class Context:
    """What a step may use besides its rows."""

    #: text similarity (runner.plan.similarity): ``similarity.matrix(a, b)`` → cosine similarities
    similarity: Any
    #: the job's seed for anything random in a step
    seed: int = 0


Parser = Callable[[str, dict[str, Any], dict[str, Any]], Parsed]
Step = Callable[[list[dict[str, Any]], dict[str, Any], Context], Outcome]

PARSERS: dict[str, Parser] = {}
STEPS: dict[str, Step] = {}
_loaded = False


def parser(name: str) -> Callable[[Parser], Parser]:
    def register(fn: Parser) -> Parser:
        PARSERS[name] = fn
        return fn
    return register


def step(name: str) -> Callable[[Step], Step]:
    def register(fn: Step) -> Step:
        STEPS[name] = fn
        return fn
    return register


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in MODULES:
            importlib.import_module(module)


def get_parser(name: str) -> Parser | None:
    _load()
    return PARSERS.get(name)


def get_step(name: str) -> Step | None:
    _load()
    return STEPS.get(name)


def parser_names() -> list[str]:
    _load()
    return sorted(PARSERS)


def step_names() -> list[str]:
    _load()
    return sorted(STEPS)


def source_of(fn: Callable[..., Any]) -> str:
    """The source text of the module defining ``fn`` (its content address: any edit of it counts)."""
    module = inspect.getmodule(fn)
    try:
        return inspect.getsource(module) if module is not None else fn.__qualname__
    except (OSError, TypeError):
        return fn.__qualname__


def parse_items(kind: str, text: str, row: dict[str, Any], args: dict[str, Any]) -> Parsed:
    """A list answer (pipelines): ``lines`` (each non-empty line, stripped) or a recipe parser's items."""
    if kind == "lines":
        return Parsed([line.strip() for line in text.splitlines() if line.strip()])
    found = get_parser(kind)
    if found is None:  # the job file was checked: only a stored job from another version gets here
        raise KeyError(f"no parser named {kind!r}")
    return found(text, row, args)
