"""What the estimate says of a pooled model (``pools:``, runner/engine/pools.py): each endpoint of its pool priced as
the engine prices it (``provider:model`` at that endpoint where that has a price, else the pooled model), the cost
range over the endpoints (the cheapest's expected cost to the dearest's worst case), the endpoint whose price a
budget reserves (the dearest: a request may go to any of them), and the endpoint its Batch API lines go through
(one, the first of the pool with a Batch API).

runner/report/estimate.py sums each endpoint's cost as it sums the model's (one ``_Sums`` each, request by
request, so context-length tiers price each request by its own size); this module says which prices and what the
sums mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.engine.pools import endpoint_prices
from runner.engine.tiers import TierPlan
from runner.providers.pricing import Pricing, Rates
from runner.report.tiers import group_prices
from runner.spec.pools import batch_endpoint, has_batch_api
from runner.spec.schema import Job
from runner.spec.stage import Stage

__all__ = ["PoolPrices", "pool_lines", "pool_prices"]


@dataclass(slots=True)
class PoolPrices:
    """One stage's pooled model: its endpoints' prices, and once summed, their costs."""

    model: str
    stage: str
    #: how the stage sends (online, batch or auto)
    mode: str
    #: each endpoint's label, the model it is priced as, its rates and those whose dearest its worst case takes
    labels: list[str]
    priced_as: list[str]
    rates: list[Rates]
    worst: list[list[Rates]]
    #: the model the Batch API lines are priced as (the batch endpoint's), and that endpoint (None: none batches)
    batch_as: str
    batch_via: str | None
    #: after :meth:`finish`: per endpoint, (expected, worst case) of the requests to send
    costs: list[tuple[float | None, float | None]] = field(default_factory=list)

    @property
    def every_worst(self) -> list[Rates]:
        """Every rate a request's worst case may be at: a budget reserves the dearest (runner/engine/reserver.py)."""
        return [r for worst in self.worst for r in worst]

    def source(self) -> str:
        """Where each endpoint's price comes from, as the estimate's ``price`` says it."""
        return "pool: " + "; ".join(f"{label} as {model} ({rates.source})"
                                    for label, model, rates in zip(self.labels, self.priced_as, self.rates,
                                                                   strict=True))

    def finish(self, group: Any, costs: list[tuple[float | None, float | None]], reserved: float | None) -> None:
        """The group's range over its endpoints: from the cheapest endpoint's expected cost to what a budget
        reserves (``reserved``: each request at its dearest endpoint's worst case)."""
        self.costs = costs
        lows = [low for low, _ in costs if low is not None]
        group.cost_low = min(lows) if lows else None
        group.cost_high = reserved
        group.price = self.source()

    def as_dict(self) -> dict[str, Any]:
        dearest = self.dearest()
        return {"stage": self.stage, "model": self.model, "mode": self.mode, "reserved_at": dearest,
                "batch_via": self.batch_via,
                "endpoints": [{"endpoint": label, "priced_as": model, "price": rates.source, "cost_low": low,
                               "cost_high": high}
                              for label, model, rates, (low, high) in zip(self.labels, self.priced_as, self.rates,
                                                                          self.costs, strict=True)]}

    def dearest(self) -> str:
        """The endpoint whose price a budget reserves: the one with the dearest worst case (the first on a tie)."""
        if not self.costs:
            return self.labels[0]
        highs = [high if high is not None else float("inf") for _, high in self.costs]
        return self.labels[highs.index(max(highs))]


def pool_prices(job: Job, pricing: Pricing, plan: TierPlan | None, model: str, stage: Stage) -> PoolPrices | None:
    """The prices of ``model``'s pool in ``stage`` (None: a model of no pool, or one with no price at all)."""
    pool = job.pools.get(model)
    if pool is None or not pool.endpoints or pricing.rates(model) is None:
        return None
    as_model = endpoint_prices(pricing, model, pool)
    labels, priced, rates, worst = [], [], [], []
    for label, priced_as in as_model.items():
        expected, worst_of = group_prices(pricing, plan, priced_as)
        if expected is None:  # a tier this endpoint has no price at: its standard price, as the engine falls back
            expected, worst_of = group_prices(pricing, None, priced_as)
        assert expected is not None  # priced as itself only where it has a price, else as the (priced) model
        labels.append(label)
        priced.append(priced_as)
        rates.append(expected)
        worst.append(worst_of)
    via = batch_endpoint(job, model)
    batch_via = via.endpoint if via is not None and has_batch_api(job, via.endpoint) else None
    return PoolPrices(model, stage.name, job.stage_mode(stage), labels, priced, rates, worst,
                      as_model.get(batch_via, model) if batch_via is not None else model, batch_via)


def pool_lines(pools: list[dict[str, Any]], usd: Callable[[float | None], str]) -> list[str]:
    """One line per stage's pooled model: each endpoint's cost range (in ``usd``) and price's source, the one a
    budget reserves; and where its batches go when the stage may batch."""
    lines = []
    for pool in pools:
        each = ", ".join(f"{e['endpoint']} {usd(e['cost_low'])} – {usd(e['cost_high'])} (as {e['priced_as']}, "
                         f"{e['price']})" for e in pool["endpoints"])
        lines.append(f"pool: {pool['stage']} {pool['model']} over {len(pool['endpoints'])} endpoints: {each}; a "
                     f"budget reserves the dearest endpoint's price ({pool['reserved_at']})")
        if pool["mode"] != "online":
            lines.append(f"pool: {pool['stage']} {pool['model']}'s Batch API lines go through endpoint "
                         f"{pool['batch_via']} alone, the first of its pool with a Batch API (batches are not spread "
                         "over a pool)" if pool["batch_via"] is not None else
                         f"pool: {pool['stage']} {pool['model']}: no endpoint of its pool has a Batch API")
    return lines
