"""Service tiers at run time (runner/providers/tiers.py says what they are): the tier each stage and model's requests
are sent at and what a shed flex request may become (:class:`Tiers`), the tiers an answer may come back at, which a
budget reserves the dearest of (ARCHITECTURE.md invariant 3), and, before anything is sent, a price for every tier
asked (:func:`check_tier_prices`), whose source the run records (``sent_with.tiers``) for the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.errors import RunnerError
from runner.plan.request import Task
from runner.providers.pricing import Pricing, Rates
from runner.providers.tiers import FLEX, PRIORITY, STANDARD
from runner.spec.schema import Job

if TYPE_CHECKING:
    from runner.engine.deadline import DeadlineSteer

__all__ = ["TierPlan", "Tiers", "check_tier_prices"]


@dataclass(frozen=True, slots=True)
class TierPlan:
    """One stage and model's tier: the one asked, and ``fallback`` (standard, or None) for a shed flex request."""

    asked: str
    fallback: str | None = None
    #: for a request the deadline planner steers (runner/engine/deadline.py): every tier it may send its group's
    #: requests at, so that a reservation holds whichever it chose
    steered: tuple[str, ...] = ()

    @property
    def may_serve(self) -> tuple[str, ...]:
        """The tiers an answer may come back at, hence be charged at: the one asked; standard too after a fallback,
        and for priority, which Gemini and OpenAI serve at standard past the account's priority limit (Gemini's
        priority page: "automatically downgraded to the Standard tier"; the answer says so)."""
        if self.steered:
            return self.steered
        if (self.asked == FLEX and self.fallback == STANDARD) or self.asked == PRIORITY:
            return (self.asked, STANDARD)
        return (self.asked,)


class Tiers:
    """Each (stage, model)'s :class:`TierPlan`, from the job's ``tier:`` and ``fallback:`` settings, built once."""

    def __init__(self, job: Job, steer: DeadlineSteer | None = None) -> None:
        #: the deadline planner's per-request tiers for the stages it plans (None: no stage is planned)
        self.steer = steer
        self.plans = {(stage.name, model): TierPlan(tier, job.stage_fallback(stage) if tier == FLEX else None)
                      for stage in job.llm_stages() for model in job.stage_models(stage)
                      if (tier := job.stage_tier(stage, model)) is not None}
        #: seconds a shed flex request is tried again at flex (``retry.flex_wait``)
        self.flex_wait = job.retry.flex_wait

    def of(self, req: Task) -> TierPlan | None:
        """``req``'s tier, None when its stage asks none (nothing is sent: the provider's default, standard); the
        deadline planner's choice for a stage it plans (a flex request then falls back to standard: the deadline
        needs it)."""
        steer = self.steer
        if steer is not None and steer.planned(req.stage, req.model):
            tier = steer.tier_of(req)
            return TierPlan(tier, STANDARD if tier == FLEX else None, steer.serves(req.stage, req.model))
        return self.plans.get((req.stage, req.model)) if self.plans else None


def tier_rates(pricing: Pricing, model: str, tier: str | None) -> Rates | None:
    """The rates an answer served at ``tier`` is charged at (None or standard: the model's own)."""
    return pricing.rates(model) if tier in (None, STANDARD) else pricing.tier_rates(model, tier)


def check_tier_prices(job: Job) -> None:
    """Before anything is sent: every tier a stage asks of a paid model has a price (genai-prices', or the job's
    ``flex:`` / ``priority:``), or one sentence says what to add; the source of each goes into the run's record
    (``sent_with.tiers``: stage -> model -> tier, fallback and price), which ``runner report`` shows."""
    tiers = Tiers(job)
    if not tiers.plans:
        return
    pricing = Pricing(job)
    recorded: dict[str, dict[str, dict[str, str | None]]] = {}
    for (stage, model), plan in tiers.plans.items():
        standard = pricing.rates(model)
        if standard is None:  # an unknown model price is said by the budget check, or counted free without one
            continue
        rates = pricing.tier_rates(model, plan.asked)
        if rates is None:
            raise RunnerError(
                f"{job.path or 'the job file'}: stage {stage} sends {model} at the {plan.asked} tier, which has no "
                f"price ({standard.source} gives none for {plan.asked}): give it one in prices: "
                f"{{{model}: {{input: USD, output: USD, {plan.asked}: {{input: USD, output: USD}}}}}} (per million "
                "tokens)")
        recorded.setdefault(stage, {})[model] = {"tier": plan.asked, "fallback": plan.fallback,
                                                 "price": rates.source}
    job.sent_with["tiers"] = recorded
