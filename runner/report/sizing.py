"""How many items a run needs before anything is paid, and what they cost: ``runner estimate JOB --detect 0.02``
(a difference between each pair of the stage's models, at ``--alpha`` with ``--power``) and ``--halfwidth 0.02``
(each model's accuracy to within that).

The counts are runner/evaluate/power.py's. What they assume about the scores (the spread of one model's item
scores, of the paired differences between two models) comes from a pilot run of the same job when ``--pilot RUN``
is given (its scored items, each item's seeds averaged first), else from that module's stated defaults; every row
says which. In a stage with ``cluster:`` the counts are raised by the design effect of its clusters (their mean
size from the dataset, the intra-cluster correlation from the pilot's item scores, else the default 0.3).

Each row also says after how many items a stage with ``stop:`` is expected to end when the spread (and, for a
pair, the difference) is as assumed: ``stop: {decide: all}`` for a pair, ``stop: {halfwidth: ...}`` for one model,
at ``--alpha`` split between the sequences such a rule runs (:func:`runner.evaluate.sequential.expected_stop`, which
bench/sequential.py checks against simulated runs).

The cost of a row is that many items asked of the model(s) concerned, at the estimate's average price of a request
to send (:mod:`runner.report.estimate`) times the requests an item makes (its seeds and variants).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from runner.errors import RunnerError
from runner.evaluate import power
from runner.evaluate.clusters import intra_cluster_correlation
from runner.plan.stage import StagePlan
from runner.report.estimate import Estimate, Group, usd
from runner.report.item_scores import cluster_map, stage_items
from runner.report.tables import Column, Table, json_text
from runner.report.terminal import clean, clean_lines
from runner.spec.schema import Job
from runner.store import Store

__all__ = ["Need", "Sizing", "check_settings", "render", "sizing"]


@dataclass(frozen=True)
class Need:
    """Items one goal needs in one stage, and their cost."""

    stage: str
    #: "detect" (a pair of models) or "halfwidth" (one model)
    goal: str
    #: the models concerned: two for detect, one for halfwidth
    models: tuple[str, ...]
    #: the difference to detect, or the half-width to reach
    size: float
    items: int
    #: items the stage has
    available: int
    #: with every item the stage has: the power against ``size`` (detect), or the half-width reached (halfwidth)
    at_all: float
    #: the standard deviation assumed (of the paired differences, or of one model's item scores), and its source
    sd: float
    source: str
    #: the cost of asking ``min(items, available)`` items of the models concerned (None: a model has no price)
    cost_low: float | None
    cost_high: float | None
    #: the stage's clusters (its cluster: field's values) and the design effect assumed; None and 1 without
    clusters: int | None = None
    design_effect: float = 1.0
    #: the items after which ``stop:`` is expected to end the stage (None: not within its items)
    with_stop: int | None = None

    @property
    def fits(self) -> bool:
        return self.items <= self.available


@dataclass
class Sizing:
    alpha: float
    power: float
    needs: list[Need]

    def as_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "power": self.power,
                "needs": [{**asdict(n), "fits": n.fits} for n in self.needs]}


def check_settings(*, detect: float | None, halfwidth: float | None, alpha: float, power_: float) -> None:
    """One sentence for a setting out of its range (before anything is planned)."""
    if detect is not None and not 0 < detect < 1:
        raise RunnerError(f"--detect must be a difference of accuracy between 0 and 1, such as 0.02 (got {detect})")
    if halfwidth is not None and not 0 < halfwidth < 0.5:
        raise RunnerError(f"--halfwidth must be between 0 and 0.5, such as 0.02 (got {halfwidth})")
    if not 0 < alpha < 0.5:
        raise RunnerError(f"--alpha must be between 0 and 0.5, such as 0.05 (got {alpha})")
    if not 0 < power_ < 1:
        raise RunnerError(f"--power must be between 0 and 1, such as 0.8 (got {power_})")


def _pilot_scores(store: Store, pilot: str | None, stage: str, cluster: str | None
                  ) -> tuple[dict[str, dict[str, float]], dict[str, str] | None]:
    """Per model, item → mean score in the pilot run's stage (empty without a pilot), and item → its cluster
    when the stage has one (as the pilot's result lines recorded it)."""
    if pilot is None:
        return {}, None
    items = stage_items(store, pilot, stage)
    scores = {model: dict(found.means()) for model, found in items.scores.items()}
    return scores, cluster_map(items, cluster) if cluster is not None else None


def _clusters(plan: StagePlan) -> int:
    """The distinct values of the stage's cluster: field over its items."""
    field = plan.stage.cluster
    return len({str(row.get(field)) for _, _, row in plan.rows()})


def _design(values: dict[str, float], cluster_of: dict[str, str] | None, size: float) -> tuple[float, str]:
    """The design effect of clusters of ``size`` items: from the pilot's intra-cluster correlation of ``values``
    when it has one, else :data:`power.DEFAULT_ICC`; and a note of which."""
    icc = intra_cluster_correlation(values, cluster_of) if cluster_of is not None and len(values) > 2 else None
    if icc is None:
        default = power.DEFAULT_ICC
        return power.design_effect(default, size), f"intra-cluster correlation {default:g} (default)"
    return power.design_effect(icc, size), f"intra-cluster correlation {icc:.2f} (pilot)"


def _per_request(group: Group) -> tuple[float | None, float | None]:
    """The estimate's average cost of one request to send of this stage and model (0 when it sends none)."""
    if group.cost_low is None:
        return None, None
    if not group.to_send:
        return 0.0, 0.0
    high = group.cost_high / group.to_send if group.cost_high is not None else None
    return group.cost_low / group.to_send, high


def _cost(groups: list[Group], items: int, per_item: int) -> tuple[float | None, float | None]:
    low = high = 0.0
    for group in groups:
        each_low, each_high = _per_request(group)
        if each_low is None:
            return None, None
        low += each_low * items * per_item
        high = None if high is None or each_high is None else high + each_high * items * per_item
    return low, high


def sizing(job: Job, est: Estimate, store: Store, *, detect: float | None = None, halfwidth: float | None = None,
           alpha: float = 0.05, power_: float = 0.8, pilot: str | None = None) -> Sizing:
    from runner.evaluate.sequential import expected_stop  # numpy: imported when sizing, not at every command's start

    check_settings(detect=detect, halfwidth=halfwidth, alpha=alpha, power_=power_)
    if pilot is not None:
        store.get_run(pilot)  # a run the store does not have is said in one sentence
    needs: list[Need] = []
    by_group = {(g.stage, g.model): g for g in est.groups}
    fallback = power.defaults()
    for stage in job.stages:
        if not stage.is_llm or stage.from_ is not None or stage.review:
            continue  # no model, rows known only once earlier stages ran, or answers a person judges
        plan = StagePlan(job, stage)
        first = plan.first_request()
        if first is None or first.gold is None:
            continue  # nothing in it is scored
        per_item = len(plan.variants)
        available = plan.total() // max(1, len(plan.models) * per_item)
        scores, cluster_of = _pilot_scores(store, pilot, stage.name, stage.cluster)
        clusters = _clusters(plan) if stage.cluster is not None else None
        size = available / clusters if clusters else 1.0
        if detect is not None:
            for a, b in itertools.combinations(plan.models, 2):
                shared = [item for item in scores.get(a, {}) if item in scores.get(b, {})]
                differences = {item: scores[b][item] - scores[a][item] for item in shared}
                if len(shared) >= 2:
                    sd = statistics.stdev(differences.values())
                    source = f"pilot run {pilot} ({len(shared)} items)"
                else:
                    sd, source = fallback.sd_difference, _default_source(pilot, "paired")
                design, said = _design(differences, cluster_of, size) if clusters else (1.0, "")
                sd = max(sd, 1e-6)
                items = power.items_to_detect(detect, sd, alpha=alpha, power=power_, design=design, cluster_size=size)
                at_all = power.power_at(available, detect, sd, alpha=alpha, design=design)
                low, high = _cost([by_group[(stage.name, m)] for m in (a, b)], min(items, available), per_item)
                # decide: all runs one sequence per pair, of (1 + B − A) / 2: its spread and the distance to 0 halve
                pairs = math.comb(len(plan.models), 2)
                stop = expected_stop(sd ** 2 / 4, alpha / pairs, detect / 2, available) if available else None
                needs.append(Need(stage.name, "detect", (a, b), detect, items, available, at_all, sd,
                                  source + (f"; {said}" if said else ""), low, high, clusters, design, stop))
        if halfwidth is not None:
            for model in plan.models:
                found = scores.get(model, {})
                if len(found) >= 2:
                    sd, source = statistics.stdev(found.values()), f"pilot run {pilot} ({len(found)} items)"
                else:
                    sd, source = fallback.sd, _default_source(pilot, "one model")
                design, said = _design(found, cluster_of, size) if clusters else (1.0, "")
                sd = max(sd, 1e-6)
                items = power.items_for_halfwidth(halfwidth, sd, alpha=alpha, design=design)
                z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
                at_all = z * sd * math.sqrt(design / available) if available else math.inf
                low, high = _cost([by_group[(stage.name, model)]], min(items, available), per_item)
                stop = (expected_stop(sd ** 2, alpha / len(plan.models), halfwidth, available) if available
                        else None)
                needs.append(Need(stage.name, "halfwidth", (model,), halfwidth, items, available, at_all, sd,
                                  source + (f"; {said}" if said else ""), low, high, clusters, design, stop))
    return Sizing(alpha, power_, needs)


def _default_source(pilot: str | None, kind: str) -> str:
    what = ("two models' scores correlated 0.3 per item, accuracy near 0.5" if kind == "paired"
            else "accuracy near 0.5")
    missing = f"not in pilot run {pilot}; " if pilot is not None else ""
    return f"{missing}defaults ({what})"


HEADERS = ("stage", "goal", "models", "items needed", "of", "clusters", "with all items", "cost of those items",
           "with stop:", "sd", "from")


def _row(need: Need) -> list[str]:
    if need.goal == "detect":
        goal = f"detect {need.size:g}"
        at_all = f"power {need.at_all:.2f}"
    else:
        goal = f"± {need.size:g}"
        at_all = f"± {need.at_all:.3f}"
    needed = f"{need.items:,}" if need.fits else f"{need.items:,} (more than there are)"
    if need.cost_low is None:
        cost = "unknown price"
    else:
        cost = usd(need.cost_low) + (f" – {usd(need.cost_high)}" if need.cost_high not in (None, need.cost_low)
                                     else "")
    clusters = "-" if need.clusters is None else f"{need.clusters:,} (design effect {need.design_effect:.2f})"
    with_stop = f"~{need.with_stop:,} items" if need.with_stop is not None else "not within them"
    return [need.stage, goal, " vs ".join(need.models), needed, f"{need.available:,}", clusters, at_all, cost,
            with_stop, f"{need.sd:.3f}", need.source]


def render(result: Sizing, fmt: str) -> str:
    if fmt == "json":
        return json_text(result.as_dict())
    table = Table([Column(h) for h in HEADERS], [[clean(c) for c in _row(n)] for n in result.needs])
    notes = [f"sizing at alpha {result.alpha:g}, power {result.power:g} (a two-sided paired test; in a stage with "
             "cluster:, the counts are raised by the design effect 1 + (items per cluster - 1) x the intra-cluster "
             "correlation); the cost is of min(needed, all) items at the estimate's average price of a request; "
             "'with stop:' is where a stage with stop: {decide: all} (a pair) or {halfwidth: ...} (one model) "
             "is expected to end if the spread and difference are as assumed (target: benchmark, the benchmark's own "
             "mean, its items drawn without replacement; alpha split between the sequences)"]
    if not result.needs:
        notes.insert(0, "no scored stage whose rows are known before the run: nothing to size")
    if fmt == "md":
        return "\n".join(clean_lines(["**Sizing**", "", *table.markdown(), "", *notes])) + "\n"
    return "\n".join(clean_lines(["Sizing", *table.text(), *notes])) + "\n"
