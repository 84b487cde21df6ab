"""Scores over items, the unit of a report's standard error and 95 % interval (:mod:`runner.evaluate.stats`): a
stage's result lines reduced to each item's mean score per model (a row's scores under several seeds, samples or
variants are averaged first), its estimate over items, and that estimate per value of each field a stage records
(``record:``), the breakdowns. Read one stage at a time, keeping only a sum and count per item and model (and each
item's recorded fields), so a report's memory does not grow with the run."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.errors import RunnerError
from runner.evaluate.clusters import clustered_mean
from runner.evaluate.stats import Estimate, ItemScores, mean_interval
from runner.store import Store

#: recorded fields with at most this many distinct values are broken down by default
MAX_BREAKDOWN_VALUES = 50
#: the cluster of an item whose result line lacks the cluster field (a row without it is refused by validate)
MISSING = "(none)"
#: how the SE and interval are made, in the JSON report
CI_METHOD = {
    "unit": "item (a stage's row id): its scores over seeds, samples and variants averaged first",
    "se": "sample sd of the item means (n-1) / sqrt(n items)",
    "interval": "normal", "level": 0.95, "z": 1.959964,
    "clipped": "to [0, 1] when every item mean is in that range",
    "degenerate": "SE 0 or one item: a Wilson score interval when item scores are 0 or 1 (ci_method wilson), "
                  "else none (ci_method null)",
    "clustered": "with a stage's cluster: field, ci_method cluster-t: the cluster-robust SE of the item means (CR1, "
                 "G/(G-1)) and a Student's t interval on clusters - 1 degrees of freedom; clusters and design_effect "
                 "(that variance over the items' own) beside it",
}


@dataclass
class StageItems:
    """One stage's scored items: per model, each item's scores (summed), and each item's recorded fields."""

    #: model → item (row id) → sum and count of its scores
    scores: dict[str, ItemScores] = field(default_factory=dict)
    #: item → recorded field → its value as text
    fields: dict[str, dict[str, str]] = field(default_factory=dict)

    def field_names(self) -> list[str]:
        return list(dict.fromkeys(name for values in self.fields.values() for name in values))

    def distinct(self, name: str) -> int:
        return len({values.get(name) for values in self.fields.values()})


def stage_items(store: Store, run_id: str, stage: str) -> StageItems:
    """A stage's scored result lines, streamed, reduced to item scores per model (failed, refused and unscored
    tasks are left out: they have no score)."""
    items = StageItems()
    for line in store.iter_results(run_id, stage):
        result = json.loads(line)
        score = result.get("score")
        if score is None:
            continue
        item = str(result.get("id"))
        items.scores.setdefault(str(result.get("model")), ItemScores()).add(item, float(score))
        recorded = result.get("fields")
        if recorded and item not in items.fields:
            items.fields[item] = {name: value_text(value) for name, value in recorded.items()}
    return items


def value_text(value: Any) -> str:
    """A recorded field's value as the breakdown names it."""
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def item_estimate(means: Iterable[float] | Mapping[str, float], cluster_of: Mapping[str, str] | None = None
                  ) -> Estimate:
    """Mean, SE and 95% interval of item means; the interval clipped to [0, 1] when every mean is in it. With
    ``cluster_of`` (item → its cluster: the stage's ``cluster:`` field) and ``means`` by item, the SE and interval
    are cluster-robust (Student's t over the clusters), where two clusters or more give one."""
    values = list(means.values()) if isinstance(means, Mapping) else list(means)
    clip = (0.0, 1.0) if all(0.0 <= v <= 1.0 for v in values) else None
    if cluster_of is not None and isinstance(means, Mapping):
        found = clustered_mean(means, {item: cluster_of.get(item, MISSING) for item in means})
        if found.se and found.low is not None and found.high is not None:
            low, high = found.low, found.high
            if clip is not None:
                low, high = max(clip[0], low), min(clip[1], high)
            return Estimate(found.n, found.mean, found.se, low, high, "cluster-t", found.clusters,
                            found.design_effect)
    return mean_interval(values, clip=clip)


def _value_order(value: str) -> tuple[int, float, str]:
    """Numbers in numeric order first, then text."""
    try:
        return 0, float(value), value
    except ValueError:
        return 1, 0.0, value


def stage_clusters(store: Store, run_id: str) -> dict[str, str]:
    """The ``cluster:`` field of each stage of the run that has one (from the job the run ran)."""
    job = json.loads(store.get_run(run_id)["job_json"])
    return {stage["name"]: stage["cluster"] for stage in job.get("stages") or [] if stage.get("cluster")}


def cluster_map(items: StageItems, field_name: str | None) -> dict[str, str] | None:
    """Item → its cluster (the value of ``field_name`` its result lines carry), or None without a field."""
    if field_name is None:
        return None
    return {item: values.get(field_name, MISSING) for item, values in items.fields.items()}


def add_item_figures(store: Store, run_id: str, rows: list[dict[str, Any]], by: str | None) -> None:
    """Each row's SE and interval over items (``items``; cluster-robust in a stage with ``cluster:``), per value
    of the recorded fields broken down (``by_field``), and the fields left out for their many values
    (``fields_left_out``). One stage at a time."""
    recorded: set[str] = set()
    clusters = stage_clusters(store, run_id)
    for stage in dict.fromkeys(r["stage"] for r in rows):
        items = stage_items(store, run_id, stage)
        cluster_of = cluster_map(items, clusters.get(stage))
        names = items.field_names()
        recorded.update(names)
        counts = {name: items.distinct(name) for name in names}
        if by is not None:
            shown, left_out = [name for name in names if name == by], {}
        else:
            shown = [name for name in names if counts[name] <= MAX_BREAKDOWN_VALUES]
            left_out = {name: n for name, n in counts.items() if n > MAX_BREAKDOWN_VALUES}
        for row in rows:
            if row["stage"] != stage:
                continue
            scores = items.scores.get(row["model"])
            means = scores.means() if scores is not None else {}
            row["items"] = item_estimate(means, cluster_of).as_dict() if means else None
            row["by_field"] = {}
            for name in shown:
                groups: dict[str, dict[str, float]] = {}
                for item, mean in means.items():
                    groups.setdefault(items.fields.get(item, {}).get(name, "(none)"), {})[item] = mean
                row["by_field"][name] = {value: item_estimate(groups[value], cluster_of).as_dict()
                                         for value in sorted(groups, key=_value_order)}
            row["fields_left_out"] = left_out
    if by is not None and by not in recorded:
        have = ", ".join(sorted(recorded))
        raise RunnerError(f"--by {by}: no stage of run {run_id} records a field {by!r} "
                          + (f"(recorded: {have})" if have else "(its stages record none: add `record: [FIELD]` "
                             "to a stage of the job to break its scores down by that field)"))
