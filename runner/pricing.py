"""Cost of one response from its usage. Prices are USD per million tokens, from the job's ``prices:``
section; local and simulated models cost nothing unless a price is given."""

from __future__ import annotations

from .spec import Job, Price


class Pricing:
    def __init__(self, job: Job) -> None:
        self.prices: dict[str, Price] = dict(job.prices)

    def cost(self, model: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        price = self.prices.get(model)
        if price is None:
            return 0.0
        cached_rate = price.cached_input if price.cached_input is not None else price.input
        uncached = max(0, input_tokens - cached_tokens)
        return (uncached * price.input + cached_tokens * cached_rate + output_tokens * price.output) / 1e6
