"""What the estimate and the report say of service tiers (runner/engine/tiers.py): the prices a tier's requests are
expected at and the dearest a budget reserves, with where each price comes from (genai-prices or the job's
``prices:``); and, once run, the tier each answer was served and charged at, from the ledger."""

from __future__ import annotations

from typing import Any

from runner.engine.tiers import TierPlan, tier_rates
from runner.providers.pricing import Pricing, Rates

__all__ = ["group_prices", "estimate_lines", "report_lines"]


def group_prices(pricing: Pricing, plan: TierPlan | None, model: str) -> tuple[Rates | None, list[Rates]]:
    """(the rates a stage and model's requests are expected at, those whose dearest its worst case takes): the tier
    asked, and every tier its answers may be served at (standard after a fallback or a priority downgrade)."""
    if plan is None:
        rates = pricing.rates(model)
        return rates, [rates] if rates is not None else []
    asked = tier_rates(pricing, model, plan.asked)
    return asked, [rates for tier in plan.may_serve if (rates := tier_rates(pricing, model, tier)) is not None]


def estimate_lines(groups: list[Any]) -> list[str]:
    """One line per stage and model sent at a tier: the tier, the price it is expected at and its source."""
    return [f"service tier: {g.stage} {g.model} at {g.tier}, priced by {g.price}"
            + (f"; its worst case at the dearest of {', '.join(g.tier_serves)} (what a budget reserves)"
               if len(g.tier_serves) > 1 else "")
            for g in groups if g.tier is not None]


def report_lines(data: dict[str, Any]) -> list[str]:
    """One line per stage and model sent at a tier: the tier asked, its price's source, and its charges by the
    tier that served them."""
    asked = (data.get("sent_with") or {}).get("tiers") or {}
    served: dict[tuple[str, str], list[str]] = {}
    for stage, model, tier, n, usd in data.get("tiers") or []:
        served.setdefault((stage, model), []).append(f"{tier} {n} (${usd:.4f})")
    lines = []
    for stage, models in sorted(asked.items()):
        for model, setting in sorted(models.items()):
            fallback = f", fallback {setting['fallback']}" if setting.get("fallback") else ""
            charged = ", ".join(served.get((stage, model), [])) or "none charged"
            lines.append(f"service tier: {stage} {model} asked {setting['tier']}{fallback}, priced by "
                         f"{setting['price']}; served and charged: {charged}")
    return lines
