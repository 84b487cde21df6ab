"""Scores and aggregates over result rows. Pure functions, no I/O.

A row is a result line as the dispatcher writes it: ``score`` (1.0 / 0.0, ``None`` when not scored: no gold,
or the request failed), ``valid`` (the parser found an answer), ``seed``, ``variant`` (the prompt-template and
other axes, a dict), ``parsed`` (original option index, or the parsed value), ``gold``, ``answer_letter`` (shown
letter chosen) and ``permutation`` (``perm[shown] = original index``; -1 for the none-of-them slot).

Conventions: rates are fractions in [0, 1] (the report multiplies by 100); an aggregate over no scored row is
``None``; an invalid answer is scored 0 and counts in the accuracy's denominator, exactly like a wrong one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.evaluate.parse import newterm_reference_letter, newterm_reference_yes_no
from runner.plan.choices import LETTERS

__all__ = [
    "MeanStd",
    "Metric",
    "PositionRate",
    "accuracy",
    "balanced_accuracy",
    "group_by",
    "invalid_rate",
    "mean_std",
    "newterm_reference_accuracy",
    "newterm_reference_score",
    "omni_accuracy",
    "omni_accuracy_rows",
    "over_seeds",
    "per_seed",
    "per_variant",
    "position_bias",
    "threshold",
]

Row = Mapping[str, Any]
Metric = Callable[[Sequence[Row]], "float | None"]


def _scored(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if row.get("score") is not None]


def accuracy(rows: Sequence[Row]) -> float | None:
    """Mean ``score`` over the scored rows (invalid answers included, as wrong)."""
    scored = _scored(rows)
    return sum(float(row["score"]) for row in scored) / len(scored) if scored else None


def balanced_accuracy(rows: Sequence[Row]) -> float | None:
    """Mean over gold classes of the accuracy within the class (macro recall): for boolean gold (CSJ),
    ``(acc on true items + acc on false items) / 2``, as the later NewTerm code computes it. A class with no row
    is left out of the mean."""
    by_gold: dict[Hashable, list[float]] = defaultdict(list)
    for row in _scored(rows):
        by_gold[row["gold"]].append(float(row["score"]))
    if not by_gold:
        return None
    return sum(sum(scores) / len(scores) for scores in by_gold.values()) / len(by_gold)


def invalid_rate(rows: Sequence[Row]) -> float | None:
    """Share of parsed answers that are invalid, over the rows that carry ``valid`` (rows with an answer)."""
    parsed = [row for row in rows if row.get("valid") is not None]
    return sum(not row["valid"] for row in parsed) / len(parsed) if parsed else None


def group_by(rows: Iterable[Row], key: str | Callable[[Row], Hashable]) -> dict[Hashable, list[Row]]:
    """Rows grouped by ``key``: a callable, or a name looked up in the row's ``variant`` first, then the row
    (so ``"template"``, ``"style"``, ``"seed"``, ``"model"`` all work). Groups keep first-seen order."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        if callable(key):
            value = key(row)
        else:
            variant = row.get("variant") or {}
            value = variant[key] if key in variant else row.get(key)
        groups.setdefault(value, []).append(row)
    return groups


def per_seed(rows: Sequence[Row], metric: Metric = accuracy) -> dict[Hashable, float | None]:
    return {seed: metric(group) for seed, group in group_by(rows, "seed").items()}


def per_variant(rows: Sequence[Row], key: str, metric: Metric = accuracy) -> dict[Hashable, float | None]:
    """``metric`` per value of one variant axis (the prompt template, the Know-No style, ...)."""
    return {value: metric(group) for value, group in group_by(rows, key).items()}


@dataclass(frozen=True, slots=True)
class MeanStd:
    """A mean with the sample standard deviation (n - 1) of the values it averages."""

    mean: float
    #: sample standard deviation; ``None`` with fewer than two values
    std: float | None
    n: int

    def format(self, scale: float = 100.0, digits: int = 2) -> str:
        """ "70.18 ± 1.23" (percent by default); the mean alone when there is no deviation."""
        if self.std is None:
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.std * scale:.{digits}f}"


def mean_std(values: Iterable[float | None]) -> MeanStd | None:
    """Mean ± sample standard deviation of the values that are not ``None``; ``None`` if there are none."""
    kept = [float(v) for v in values if v is not None]
    if not kept:
        return None
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1)) if len(kept) > 1 else None
    return MeanStd(mean, std, len(kept))


def over_seeds(rows: Sequence[Row], metric: Metric = accuracy) -> MeanStd | None:
    """``metric`` per seed, then mean ± sample standard deviation over the seeds."""
    return mean_std(per_seed(rows, metric).values())


@dataclass(frozen=True, slots=True)
class PositionRate:
    """For one shown letter: how often it was chosen and how often the gold was shown there."""

    chosen: float
    gold: float
    n_chosen: int
    n_gold: int

    @property
    def excess(self) -> float:
        """``chosen - gold``: positive when the model favours this position beyond what the gold explains."""
        return self.chosen - self.gold


def position_bias(rows: Sequence[Row], letters: str = LETTERS) -> dict[str, PositionRate]:
    """Answer-position bias over the rows with a valid answer, a permutation and a gold that is shown (rows
    without the gold, as in Know-No's prompts without it, are left out unless their gold is the none-of-them
    slot's -1): per shown letter, the share of answers choosing it against the share of items whose gold was
    shown there. Both shares are over the same rows, so each sums to 1."""
    chosen: dict[str, int] = defaultdict(int)
    gold_at: dict[str, int] = defaultdict(int)
    width = 0
    n = 0
    for row in rows:
        perm = row.get("permutation")
        if not row.get("valid") or not perm or row.get("gold") is None or row["gold"] not in perm:
            continue
        letter = row.get("answer_letter")
        if letter is None:
            parsed = row.get("parsed")
            if parsed not in perm:
                continue
            letter = letters[perm.index(parsed)]
        n += 1
        width = max(width, len(perm))
        chosen[letter] += 1
        gold_at[letters[perm.index(row["gold"])]] += 1
    if not n:
        return {}
    return {
        letter: PositionRate(chosen[letter] / n, gold_at[letter] / n, chosen[letter], gold_at[letter])
        for letter in letters[:width]
    }


def omni_accuracy(with_gold: float, without_gold: Sequence[float]) -> float:
    """Know-No's OmniAccuracy: ½ (accuracy with the gold + mean accuracy over the prompt styles without it)."""
    if not without_gold:
        raise ValueError("OmniAccuracy needs at least one accuracy without the gold option")
    return (with_gold + sum(without_gold) / len(without_gold)) / 2


def omni_accuracy_rows(
    rows: Sequence[Row], *, style: str = "style", with_gold: Hashable = "with_gold", metric: Metric = accuracy
) -> float | None:
    """OmniAccuracy from rows whose ``variant[style]`` names the prompt style: ``with_gold`` is the style with
    the gold option, every other style counts as a style without it. ``None`` when a side has no scored row."""
    by_style = per_variant(rows, style, metric)
    acc_with = by_style.pop(with_gold, None)
    without = [acc for acc in by_style.values() if acc is not None]
    if acc_with is None or not without:
        return None
    return omni_accuracy(acc_with, without)


def threshold(value: float | None, *, at_least: float | None = None, at_most: float | None = None) -> bool:
    """Whether a parsed rating passes: ``threshold(r, at_least=8)`` keeps NewTerm's true CSJ sentences,
    ``threshold(r, at_most=3)`` its false ones. An invalid rating (``None``) never passes."""
    if value is None:
        return False
    return (at_least is None or value >= at_least) and (at_most is None or value <= at_most)


# -- NewTerm reference-compatible scoring ----------------------------------------------------------------------


def newterm_reference_score(
    task: str, response: str | None, gold: int | bool, options: Sequence[str] | None = None
) -> float:
    """1.0 or 0.0 for one answer as the released NewTerm code scores it (``scoring: newterm-reference``).

    ``task`` is COMA, COST or CSJ; for COMA/COST, ``options`` are the options as shown and ``gold`` the gold's
    shown position; for CSJ, ``gold`` is the boolean label. Invalid, empty and missing answers score 0."""
    text = response or ""
    if task.upper() == "CSJ":
        parsed = newterm_reference_yes_no(text)
        return 1.0 if parsed.valid and parsed.value == bool(gold) else 0.0
    if options is None:
        raise ValueError(f"{task}: the reference letter scoring needs the options")
    parsed = newterm_reference_letter(text, options)
    return 1.0 if parsed.valid and parsed.value == gold else 0.0


def newterm_reference_accuracy(
    task: str, answers: Iterable[tuple[str | None, int | bool, Sequence[str] | None]], *, balanced: bool = False
) -> float | None:
    """Accuracy over ``(response, gold, options)`` triples with :func:`newterm_reference_score`. For CSJ,
    ``balanced=True`` gives the balanced accuracy of the code's later commit (the paper's numbers are plain)."""
    rows = [{"score": newterm_reference_score(task, r, g, o), "gold": g} for r, g, o in answers]
    return balanced_accuracy(rows) if balanced else accuracy(rows)
