"""Scorers: how a parsed answer is compared with the gold, one registered function per parse kind.

A scorer is ``fn(parsed, gold) -> float`` (1.0 right, 0.0 wrong); ``parsed`` is None for an invalid answer,
which every scorer counts wrong. A stage's parse kind picks its scorer; a kind with none registered compares
for equality. A new kind of answer registers its scorer here and the engine needs no change::

    @scorer("my_kind")
    def my_kind(parsed, gold):
        ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Scorer = Callable[[Any, Any], float]

SCORERS: dict[str, Scorer] = {}


def scorer(*kinds: str) -> Callable[[Scorer], Scorer]:
    """Register ``fn`` as the scorer of these parse kinds."""

    def register(fn: Scorer) -> Scorer:
        for kind in kinds:
            SCORERS[kind] = fn
        return fn

    return register


def exact(parsed: Any, gold: Any) -> float:
    """Right when the parsed answer equals the gold (an option index, a label, a number)."""
    return 1.0 if parsed is not None and parsed == gold else 0.0


@scorer("letters")
def same_set(parsed: Any, gold: Any) -> float:
    """Several letters: right when the chosen options are exactly the gold ones (a single gold is a set of one)."""
    wanted = sorted(gold) if isinstance(gold, list) else [gold]
    return 1.0 if parsed == wanted else 0.0


@scorer("yes_no")
def yes_no(parsed: Any, gold: Any) -> float:
    """A yes/no answer against a boolean gold, or one written as text ("true", "yes", "1")."""
    if isinstance(gold, str):
        gold = gold.strip().lower() in ("true", "yes", "1")
    return exact(parsed, gold)


def score(kind: str, parsed: Any, gold: Any) -> float:
    """The score of one parsed answer under its parse kind's scorer."""
    return SCORERS.get(kind, exact)(parsed, gold)
