"""A model's prices in USD per million tokens (:class:`Rates`): what a response with some usage costs, and the
most a request can cost (a budget's reservation). Where the prices come from is :mod:`runner.providers.pricing`'s
concern."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PER", "Rates"]

PER = 1_000_000  # rates are USD per this many tokens


@dataclass(frozen=True, slots=True)
class Rates:
    """A model's prices in USD per million tokens, and where they come from."""

    input: float
    #: a cache-read input token (the input price when the model has no cache price)
    cached_input: float
    #: a cache-write input token (the input price when the model has no cache-write price)
    cache_write: float
    output: float
    #: ``"job prices: <model>"``, ``"genai-prices <version>: <provider>/<model id>"`` or ``"free: ..."``
    source: str
    #: ``(threshold, rates)`` in ascending order: ``rates`` replace these for a request whose input tokens
    #: exceed ``threshold``
    tiers: tuple[tuple[int, Rates], ...] = ()
    #: a cache-write input token kept for an hour (Anthropic's ``ttl: "1h"``, twice the input price); None: the
    #: ``cache_write`` price
    cache_write_1h: float | None = None

    @property
    def hour_write(self) -> float:
        return self.cache_write if self.cache_write_1h is None else self.cache_write_1h

    def at(self, input_tokens: int) -> Rates:
        """The rates that apply to a request with this many input tokens (its tier)."""
        for threshold, rates in reversed(self.tiers):
            if input_tokens > threshold:
                return rates
        return self

    def cost(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0, cache_write_tokens: int = 0,
             cache_write_1h_tokens: int = 0) -> float:
        """USD for one response's usage; ``input_tokens`` include the cached and cache-written ones, and
        ``cache_write_tokens`` the ``cache_write_1h_tokens`` written for an hour."""
        rates = self.at(input_tokens)
        uncached = max(0, input_tokens - cached_tokens - cache_write_tokens)
        hour = min(cache_write_1h_tokens, cache_write_tokens)
        return (
            uncached * rates.input
            + cached_tokens * rates.cached_input
            + (cache_write_tokens - hour) * rates.cache_write
            + hour * rates.hour_write
            + output_tokens * rates.output
        ) / PER

    def worst_case(self, input_tokens: int, max_output_tokens: int, writable: int | None = None,
                   hour: bool = True) -> float:
        """The most a request with at most these input and output tokens can cost: every output token at the
        output price; of the input tokens, the ``writable`` ones (those before the request's last prompt-cache
        mark; None: all of them) at the dearest input price, a cache write (at the hour's price when ``hour``)
        costing more than a plain input token at Anthropic, and the rest at the dearer of the plain and the cached
        price, since nothing after the last mark is written to a cache (Anthropic's prompt-caching page: the
        cache holds the prefix up to a ``cache_control`` block); each price over every tier a count up to
        ``input_tokens`` can fall in."""
        candidates = [self, *(rates for threshold, rates in self.tiers if input_tokens > threshold)]
        per_plain = max(max(r.input, r.cached_input) for r in candidates)
        per_write = max(max(r.cache_write, r.hour_write if hour else r.cache_write) for r in candidates)
        per_output = max(r.output for r in candidates)
        written = input_tokens if writable is None else min(max(writable, 0), input_tokens)
        return (written * max(per_plain, per_write) + (input_tokens - written) * per_plain
                + max_output_tokens * per_output) / PER

    @property
    def is_free(self) -> bool:
        return not self.tiers and self.input == self.cached_input == self.cache_write == self.hour_write == \
            self.output == 0
