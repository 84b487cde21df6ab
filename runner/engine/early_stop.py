"""A stage's ``stop:`` rule as its answers arrive: stop sending once the answer is known.

The stage's items are asked in an order shuffled by the rule's seed (:meth:`runner.plan.stage.StagePlan.rows`). As
answers are recorded, each item's mean score per model is gathered (its seeds and variants: one item). Items enter
the confidence sequences in that same order, each once every model the rule reads has answered all of its
requests: an item answered early waits for the ones before it, because the sequences are valid for items taken in
a random order, not in the order answers happen to come back (a long answer, slower, may be a wrong one more
often). The sequences (:class:`runner.evaluate.sequential.BettingSequence`, without replacement over the stage's
items) are:

- ``halfwidth: h``: one per model, of its accuracy; the rule holds once each is within ± h;
- ``decide: [A, B]`` or ``decide: all``: one per pair, of the difference B − A; the rule holds once each excludes 0
  (the verdict: the side it lies on).

With ``target: population`` the sequences are of the population the items are drawn from (each item an
independent draw, or with ``cluster:`` each cluster, asked whole in a shuffled order of clusters, its items' mean
one draw): a finite benchmark may end before they settle, and then the stage is not decided.

``alpha`` is split evenly between the sequences (Bonferroni: valid together, at every look). The rule is read after
``min_items`` items. A task that failed leaves its item without a score: the sequences need every item in order, so
the rule stops being read for the rest of the stage (it then runs to the end) and the reason says so.

On a resume the answers an earlier attempt committed are fed first, in the same order, so the rule picks up where
it was. With several workers on one run each feeds its rule what every worker wrote to the store (read as it comes,
each task once), and the first to see the rule hold writes its decision to the store, where the others read it and
stop too (runner/engine/dispatch.py).

Each look (a draw fed) keeps every sequence's interval; :meth:`StageStopper.record` is what the run stores of the
rule (``stage_stops``): its decision or why it did not stop, the items asked of all, and the sequences at up to
:data:`TRACE_POINTS` looks, which the reports and the viewer plot.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from runner.evaluate.sequential import BettingSequence, Interval, difference_interval, difference_score
from runner.plan.stage import StagePlan
from runner.spec.stage import StopRule
from runner.store.rows import TaskRow

#: looks kept in a stored record (evenly spaced, the first and last among them)
TRACE_POINTS = 200

#: parse kinds whose scores are 0 or 1 (an item's mean is then a multiple of 1 / its requests: the exact grid)
BINARY_PARSES = {"letter", "letters", "yes_no", "none_of_them", "label", "loglikelihood"}


@dataclass
class Decision:
    """What a stopped stage decided, after how many items."""

    stage: str
    items: int
    total: int
    #: one line per model (halfwidth) or pair (decide)
    found: list[str]

    def sentence(self) -> str:
        return (f"stage {self.stage} stopped after {self.items:,} of its {self.total:,} items: "
                + "; ".join(self.found))


class StageStopper:
    """One stage's rule (module docstring)."""

    def __init__(self, plan: StagePlan) -> None:
        stage = plan.stage
        rule = stage.stop
        assert rule is not None
        self.rule: StopRule = rule
        self.stage = stage.name
        #: the draws, in order: each item alone (the benchmark), or each cluster with its items (the population)
        self.population = rule.target == "population"
        self.units = plan.cluster_order() if self.population else [(item, [item]) for item in plan.item_order()]
        self.items = sum(len(items) for _, items in self.units)
        self.total = len(self.units)
        self.per_item = len(plan.variants)
        self.models = list(plan.models)
        if rule.decide == "all":
            self.pairs = list(itertools.combinations(self.models, 2))
        elif rule.decide is not None:
            self.pairs = [(rule.decide[0], rule.decide[1])]
        else:
            self.pairs = []
        self.watched = self.models if rule.halfwidth is not None else list(dict.fromkeys(
            model for pair in self.pairs for model in pair))
        looks = (len(self.models) if rule.halfwidth is not None else 0) + len(self.pairs)
        alpha = rule.alpha / max(1, looks)
        exact = stage.parse in BINARY_PARSES and stage.scorer is None and not self.population
        resolution = self.per_item if exact else None
        # the benchmark: its items without replacement; the population: independent draws of items or clusters
        size = None if self.population else self.total
        self.accuracy = {model: BettingSequence(alpha, size, resolution=resolution)
                         for model in (self.models if rule.halfwidth is not None else [])}
        self.differences = {pair: BettingSequence(alpha, size, resolution=2 * resolution if resolution else None)
                            for pair in self.pairs}
        #: model → item → [sum of scores, scores seen]
        self.scores: dict[str, dict[str, list[float]]] = {model: {} for model in self.watched}
        self.position = 0
        #: items of the draws fed so far
        self.fed = 0
        self.decision: Decision | None = None
        #: why the rule is no longer read (a failed task), if it is not
        self.off: str | None = None
        #: each look: (items fed, [(low, high) of each sequence of :meth:`names`])
        self.trace: list[tuple[int, list[tuple[float, float]]]] = []
        #: draws between two looks kept in the trace (doubled each time it fills up)
        self.stride = 1
        #: the tasks fed (each once: this process's as recorded, and every worker's as read from the store)
        self.seen: set[str] = set()
        #: the decision was another worker's, read from the store
        self.adopted = False

    # -- answers in ----------------------------------------------------------------------------------
    def recorded(self, task: TaskRow) -> None:
        """Recorder observer: a task of the run was answered (or failed); read as soon as it is recorded, so the
        rule holds before more is sent than its decision needed."""
        if task.stage == self.stage and task.item not in self.seen:
            self.seen.add(task.item)
            self.add(task.model, task.row_id, task.score if task.status == "done" else None)
            self.advance()

    def feed(self, rows: Iterable[dict[str, Any]]) -> None:
        """Tasks of the stage as the store has them (``Store.stage_scores``): an earlier attempt's, on a resume, or
        other workers'. Each is fed once."""
        for row in rows:
            if row["item"] in self.seen:
                continue
            self.seen.add(row["item"])
            self.add(str(row["model"]), str(row["row_id"]), row["score"] if row["status"] == "done" else None)
        self.advance()

    def adopt(self, record: dict[str, Any]) -> None:
        """Another worker's decision, read from the store: this process stops the stage too."""
        if self.decision is None and record.get("stopped"):
            self.decision = Decision(self.stage, int(record["items_asked"]), self.items, list(record["found"]))
            self.adopted = True

    def add(self, model: str, item: str, score: float | None) -> None:
        if model not in self.scores or self.off is not None:
            return
        if score is None:
            self.off = (f"stage {self.stage}: item {item} of {model} failed, so early stopping is off for the rest "
                        "of the stage (its sequences take every item in order)")
            return
        found = self.scores[model].setdefault(item, [0.0, 0])
        found[0] += float(score)
        found[1] += 1

    # -- the rule ------------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.decision is not None

    def _mean(self, model: str, items: list[str]) -> float | None:
        """The mean of the items' means (each over its seeds and variants), once every one is complete."""
        total = 0.0
        for item in items:
            found = self.scores[model].get(item)
            if found is None or found[1] < self.per_item:
                return None
            total += found[0] / found[1]
        return min(1.0, max(0.0, total / len(items)))

    def advance(self) -> None:
        """Feed the draws complete in the planned order; read the rule."""
        while self.decision is None and self.off is None and self.position < self.total:
            _, items = self.units[self.position]
            means = {model: self._mean(model, items) for model in self.watched}
            if any(mean is None for mean in means.values()):
                return
            for model, sequence in self.accuracy.items():
                sequence.update(means[model])
            for (a, b), sequence in self.differences.items():
                sequence.update(float(difference_score(means[a], means[b])))
            self.position += 1
            self.fed += len(items)
            if self.position % self.stride == 0 or self.position == self.total:
                self._look()
            if self.fed >= max(1, self.rule.min_items):
                self._read_rule()

    def names(self) -> list[str]:
        """What each sequence is of: a model's accuracy, or a pair's difference ``B − A``."""
        return [*self.accuracy, *(f"{b} − {a}" for a, b in self.differences)]

    def _look(self) -> None:
        looked: list[tuple[float, float]] = []
        for sequence in self.accuracy.values():
            interval = sequence.interval()
            assert isinstance(interval, Interval)
            looked.append((interval.low, interval.high))
        for sequence in self.differences.values():
            interval = sequence.interval()
            assert isinstance(interval, Interval)
            difference = difference_interval(interval)
            looked.append((difference.low, difference.high))
        self.trace.append((self.fed, looked))
        if len(self.trace) >= 2 * TRACE_POINTS:  # bounded: every other look kept, then every second draw looked at
            self.trace = self.trace[::2]
            self.stride *= 2

    def record(self) -> dict[str, object]:
        """What the run stores of the rule (module docstring)."""
        looks = self.trace
        if not looks or looks[-1][0] != self.fed:
            self._look()  # the last draw fed, between two kept looks
            looks = self.trace
        if len(looks) > TRACE_POINTS:
            last = len(looks) - 1
            looks = [looks[round(i * last / (TRACE_POINTS - 1))] for i in range(TRACE_POINTS)]
        return {"stage": self.stage, "rule": self.rule.model_dump(exclude_none=True), "stopped": self.stopped,
                "summary": self.summary(), "found": self.decision.found if self.decision else [],
                "items_asked": self.fed, "items_total": self.items,
                "target": "population" if self.population else "benchmark",
                "sequences": [{"name": name, "of": "accuracy" if i < len(self.accuracy) else "difference"}
                              for i, name in enumerate(self.names())],
                "looks": [[fed, [[round(low, 6), round(high, 6)] for low, high in looked]] for fed, looked in looks]}

    def _read_rule(self) -> None:
        found: list[str] = []
        halfwidth = self.rule.halfwidth
        for model, sequence in self.accuracy.items():
            interval = sequence.interval()
            assert isinstance(interval, Interval)
            if halfwidth is not None and not interval.halfwidth <= halfwidth or self._exhausted():
                return
            found.append(f"{model} {100 * (interval.low + interval.high) / 2:.1f}% ± {100 * interval.halfwidth:.1f}")
        for (a, b), sequence in self.differences.items():
            interval = sequence.interval()
            assert isinstance(interval, Interval)
            difference = difference_interval(interval)
            if not difference.excludes(0.0) or self._exhausted():
                return
            if difference.low > 0:
                better, worse, low, high = b, a, difference.low, difference.high
            else:
                better, worse, low, high = a, b, -difference.high, -difference.low
            found.append(f"{better} better than {worse} (by {100 * low:.1f} to {100 * high:.1f} points)")
        self.decision = Decision(self.stage, self.fed, self.items, found)

    def _exhausted(self) -> bool:
        """Every draw is in: the benchmark's mean is then simply known (no early stop), and the population's rule
        did not hold in time."""
        return self.position >= self.total

    def summary(self) -> str | None:
        """The sentence the run ends with for this stage: what it decided, or why it did not stop early."""
        if self.decision is not None:
            return self.decision.sentence()
        if self.off is not None:
            return self.off
        target = "the population" if self.population else "the benchmark"
        return (f"stage {self.stage} asked all {self.items:,} items: its stop: rule on {target} did not hold before "
                f"the end (alpha {self.rule.alpha:g})")


#: seconds between two reads of the store by a worker's rule (with other workers on the run)
WATCH_EVERY = 0.25


async def watch(stopper: StageStopper, store: Any, run_id: str, position: int, alone: Callable[[], bool]) -> None:
    """One of several workers' rule: fed every worker's answers as the store has them since ``position`` (each task
    once), it writes this process's decision to the store as soon as it holds, or takes another worker's from
    there. While the process is ``alone`` on the run its own answers are all there is and the answers in the store
    are not read; its decisions still are: a worker that decided, wrote its decision and left before this one read
    it leaves this one alone, and it asked the rest of the stage (a clean-clone run of the suite caught it). Ends
    once the stage is stopped and the decision is in the store; the dispatcher cancels it at the stage's end
    otherwise. ``store``: the engine's :class:`runner.store.offloop.LoopStore`."""
    import asyncio

    while True:
        if not alone() or stopper.stopped:
            position, rows = await store.stage_scores(run_id, stopper.stage, position)
            stopper.feed(rows)
        if not stopper.stopped:
            for record in await store.stops(run_id):
                if record.get("stage") == stopper.stage:
                    stopper.adopt(record)
        if stopper.stopped:
            if not stopper.adopted:
                await store.record_stop(run_id, stopper.stage, stopper.record())
            return
        await asyncio.sleep(WATCH_EVERY)
