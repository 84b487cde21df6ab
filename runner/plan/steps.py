"""The data operations of a pipeline stage (join, concat, explode, group, dedupe, sample, shuffle, top_k,
filter, set, similarity, recipe): rows in, rows out, and the rows dropped counted by rule for the funnel.

Rows are plain dicts. ``_id`` is a row's identity (the base of its requests' items and of its option
shuffles); fields starting with ``_`` are never written to output files.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from runner.errors import RunnerError
from runner.plan.prompts import compile_expression
from runner.recipes import Context, Outcome, get_step
from runner.spec.stage import Stage

Rows = list[dict[str, Any]]


def run_step(stage: Stage, inputs: dict[str, Rows], ctx: Context) -> Outcome:
    """Apply the stage's data operation to its input rows (by source stage name, in ``from:`` order)."""
    op = stage.data_ops()[0]
    if op == "join":
        return _join(stage, inputs)
    rows = _concat(inputs) if len(inputs) > 1 else next(iter(inputs.values()))
    if op == "concat":
        return Outcome(rows)
    if op == "recipe":
        found = get_step(stage.recipe or "")
        if found is None:
            raise RunnerError(f"stage {stage.name}: no recipe named {stage.recipe!r}")
        return found([dict(row) for row in rows], dict(stage.args), ctx)
    return _OPS[op](stage, rows, ctx)


def _concat(inputs: dict[str, Rows]) -> Rows:
    """Every input's rows in turn; ids get their stage's name in front, so rows of different stages differ."""
    return [{**row, "_id": f"{name}:{row['_id']}"} for name, rows in inputs.items() for row in rows]


def _key(row: dict[str, Any], fields: list[str]) -> tuple[str, ...]:
    return tuple(repr(row.get(field)) for field in fields)


def _join(stage: Stage, inputs: dict[str, Rows]) -> Outcome:
    assert stage.join is not None
    on, names = stage.join.by, list(inputs)
    first, others = inputs[names[0]], [(name, _index(inputs[name], on)) for name in names[1:]]
    out, dropped = [], Counter[str]()
    for row in first:
        merged, missing = dict(row), None
        for name, index in others:
            match = index.get(_key(row, on))
            if match is None:
                missing = missing or name
                continue
            merged.update({k: v for k, v in match.items() if k != "_id"})
        if missing is not None and stage.join.how == "inner":
            dropped[f"no matching row in {missing}"] += 1
            continue
        out.append(merged)
    return Outcome(out, dropped)


def _index(rows: Rows, on: list[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    index: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in rows:
        index.setdefault(_key(row, on), row)  # the first row of a key joins
    return index


def _explode(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    assert stage.explode is not None
    field, into = stage.explode.field, stage.explode.as_ or stage.explode.field
    out, dropped = [], Counter[str]()
    for row in rows:
        elements = row.get(field)
        if not isinstance(elements, list) or not elements:
            dropped[f"no {field}"] += 1
            continue
        # the list stays on the rows when its elements go under another name (a row per related term that
        # still knows all of them)
        parent = row if into != field else {k: v for k, v in row.items() if k != field}
        for n, element in enumerate(elements, start=1):
            child = {**parent, **element} if isinstance(element, dict) else {**parent, into: element}
            child["_id"] = f"{row['_id']}.{n}"
            out.append(child)
    return Outcome(out, dropped)


def _group(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    """Rows sharing the ``by`` fields become one: the first row's fields, plus each collected field's list."""
    assert stage.group is not None
    groups: dict[tuple[str, ...], Rows] = {}
    for row in rows:
        groups.setdefault(_key(row, stage.group.by), []).append(row)
    out = []
    for members in groups.values():
        merged = {k: v for k, v in members[0].items() if k not in stage.group.collect.values()}
        for into, field in stage.group.collect.items():
            merged[into] = [member.get(field) for member in members]
        merged["_id"] = _parent_id([str(member["_id"]) for member in members])
        out.append(merged)
    return Outcome(out)


def _parent_id(ids: list[str]) -> str:
    """The id rows exploded from one row had before (``7.1``, ``7.2`` → ``7``), else the first id."""
    parents = {item.rpartition(".")[0] for item in ids}
    if len(parents) == 1 and (parent := parents.pop()):
        return parent
    return ids[0]


def _dedupe(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    assert stage.dedupe is not None
    seen: set[tuple[str, ...]] = set()
    out, dropped = [], Counter[str]()
    for row in rows:
        fields = stage.dedupe.by or sorted(k for k in row if not k.startswith("_"))
        key = _key(row, fields)
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        out.append(row)
    return Outcome(out, dropped)


def _groups(rows: Rows, by: list[str]) -> dict[tuple[str, ...], list[int]]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for position, row in enumerate(rows):
        groups.setdefault(_key(row, by), []).append(position)
    return groups


def _sample(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    """``n`` rows of each group, chosen at random with the seed (the same rows on every run)."""
    assert stage.sample is not None
    seed = ctx.seed if stage.sample.seed is None else stage.sample.seed
    chosen: set[int] = set()
    for key, positions in _groups(rows, stage.sample.by).items():
        rng = random.Random(f"{seed}|{'|'.join(key)}")
        chosen.update(positions if len(positions) <= stage.sample.n else rng.sample(positions, stage.sample.n))
    out = [row for position, row in enumerate(rows) if position in chosen]
    dropped = Counter({"not sampled": len(rows) - len(out)}) if len(out) < len(rows) else Counter[str]()
    return Outcome(out, dropped)


def _shuffle(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    assert stage.shuffle is not None
    out = list(rows)
    random.Random(ctx.seed if stage.shuffle.seed is None else stage.shuffle.seed).shuffle(out)
    return Outcome(out)


def _top_k(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    """The ``k`` rows of each group with the highest (``order: asc``: lowest) score, in input order."""
    top = stage.top_k
    assert top is not None
    kept: set[int] = set()
    for positions in _groups(rows, top.by).values():
        def rank(position: int) -> tuple[int, float]:
            score = rows[position].get(top.score)
            if not isinstance(score, int | float):
                return (1, 0.0)  # no score: last
            return (0, -score if top.order == "desc" else score)
        kept.update(sorted(positions, key=rank)[: top.k])
    out = [row for position, row in enumerate(rows) if position in kept]
    dropped = Counter({f"not in the top {top.k} by {top.score}": len(rows) - len(out)}) if len(out) < len(rows) \
        else Counter[str]()
    return Outcome(out, dropped)


def _evaluate(stage: Stage, expression: Callable[..., Any], row: dict[str, Any], text: str) -> Any:
    try:
        return expression(**{**row, "row": row})
    except Exception as exc:  # a user's expression: undefined names, None compared to a number, ...
        raise RunnerError(f"stage {stage.name}: {text!r} fails on row {row.get('_id')}: {exc}") from None


def _filter(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    assert stage.filter is not None
    keep = compile_expression(stage.filter.keep)
    rule = stage.filter.rule or f"not {stage.filter.keep}"
    out = [row for row in rows if _evaluate(stage, keep, row, stage.filter.keep)]
    return Outcome(out, Counter({rule: len(rows) - len(out)}) if len(out) < len(rows) else Counter[str]())


def _set(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    assert stage.set is not None
    expressions = {field: (text, compile_expression(text)) for field, text in stage.set.items()}
    out = []
    for row in rows:
        row = dict(row)
        for field, (text, expression) in expressions.items():
            row[field] = _evaluate(stage, expression, row, text)
        out.append(row)
    return Outcome(out)


def _similarity(stage: Stage, rows: Rows, ctx: Context) -> Outcome:
    """Each row's similarity of two text fields (e.g. a guessed meaning and the dictionary's)."""
    step = stage.similarity
    assert step is not None
    out = []
    for row in rows:
        row = dict(row)
        row[step.as_] = ctx.similarity.matrix([str(row.get(step.a) or "")], [str(row.get(step.b) or "")])[0][0]
        out.append(row)
    return Outcome(out)


_OPS: dict[str, Callable[[Stage, Rows, Context], Outcome]] = {
    "explode": _explode,
    "group": _group,
    "dedupe": _dedupe,
    "sample": _sample,
    "shuffle": _shuffle,
    "top_k": _top_k,
    "filter": _filter,
    "set": _set,
    "similarity": _similarity,
}
