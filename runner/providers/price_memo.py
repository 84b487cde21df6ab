"""genai-prices' answers kept between runs, for the models whose price does not depend on the time.

Looking a model up in genai-prices imports its types and its data module (every provider's prices, 1.6 MB of
Python): about 0.05 s of CPU on this project's machine, on the way to a paid model's first request, for the same
few answers every time. So the rates :mod:`runner.providers.pricing` made of a model's prices are written to a small
JSON file in the runner's cache folder (``user_cache.py``: ``~/.cache/llm-job-runner/genai-prices-rates.json``; the
variable RUNNER_PRICE_MEMO names another file, or ``off`` for none) and read back by the next process, which then
imports genai-prices only when it needs more than a remembered model's rates (a model not remembered, a price it
does not have).

A model is kept with the day from which its prices hold: genai-prices dates a new price (``StartDateConstraint``),
so once every dated price of a model has started, its rates stay what they are now, from the latest of those days
on; a request or a report of an earlier moment looks genai-prices up as before. A model with a price that has not
started yet, or that changes with the time of day, is not kept. With the standard rates go the Batch API's and the
service tiers' (None where genai-prices has none). The file is tied to the installed data and
to the code that converts it: its key is made of genai-prices' data file, ``pricing.py`` and ``rates.py`` (path,
size and modification time of each), and a file with another key is not read (:func:`key`). Nothing in it is a
secret: model ids and their public prices.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import user_cache

from .rates import Rates

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo

__all__ = ["PriceMemo", "Remembered", "key", "recall", "remember", "settled_since"]

#: the file's name in the cache folder
NAME = "genai-prices-rates.json"
#: the file's format, the key's first part
FORMAT = 1


def key() -> str | None:
    """What the remembered rates were made from: genai-prices' installed data file, ``pricing.py`` and ``rates.py``
    (path, size and modification time of each), found without importing genai-prices; None when it is not
    installed."""
    try:
        spec = importlib.util.find_spec("genai_prices")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    parts = [str(FORMAT)]
    here = Path(__file__).parent
    for path in (Path(spec.origin).with_name("data.py"), here / "pricing.py", here / "rates.py"):
        try:
            stat = path.stat()
        except OSError:
            return None
        parts += [str(path), str(stat.st_size), str(stat.st_mtime_ns)]
    return "|".join(parts)


class PriceMemo:
    """The remembered rates of one file, read on first need and written again when one is added."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: str | None = None
        self._entries: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._key = key()
            data = user_cache.read_json(self.path) if self._key is not None else {}
            models = data.get("models")
            self._entries = models if data.get("key") == self._key and isinstance(models, dict) else {}
        return self._entries

    def recall(self, provider_id: str, model_ref: str) -> dict[str, Any] | None:
        """What :meth:`keep` was given for genai-prices' ``provider_id`` and ``model_ref``, or None."""
        found = self._load().get(f"{provider_id}/{model_ref}")
        return found if isinstance(found, dict) else None

    def keep(self, provider_id: str, model_ref: str, rates: dict[str, Any]) -> None:
        """Remember ``rates`` (JSON-ready) and write the file again if they are new."""
        entries = self._load()
        if self._key is None or entries.get(f"{provider_id}/{model_ref}") == rates:
            return
        entries[f"{provider_id}/{model_ref}"] = rates
        user_cache.write_json(self.path, {"key": self._key, "models": entries})


def settled_since(info: ModelInfo, moment: datetime) -> date | None:
    """The day from which genai-prices gives ``info`` the prices of ``moment`` in every price context (so that they
    may be remembered): the latest start of a price in force; None when a price changes with the time
    of day or starts after ``moment``."""
    from genai_prices.types import StartDateConstraint

    since = date.min
    prices = info.prices if isinstance(info.prices, list) else []
    for constraint in [p.constraint for p in prices] + [v.constraint for v in info.price_variants or ()]:
        if constraint is None:
            continue
        if not isinstance(constraint, StartDateConstraint) or not constraint.active(moment):
            return None
        since = max(since, constraint.start_date)
    return since


@dataclass(frozen=True, slots=True)
class Remembered:
    """A model's rates as remembered: its standard rates, and its rates in each price context genai-prices was
    asked about (``batch``, ``flex``, ``priority``: None where it has no such price)."""

    provider_id: str
    model_ref: str
    #: the day from which these are genai-prices' rates (its latest start of a price in force; date.min: always)
    since: date
    rates: Rates
    variants: dict[str, Rates | None]


def _as_json(rates: Rates) -> dict[str, Any]:
    data = asdict(rates)  # each tier as a [threshold, {...}] pair, its own tiers empty
    data["tiers"] = [[threshold, tier] for threshold, tier in data["tiers"]]
    return data


def _rates(data: dict[str, Any]) -> Rates:
    tiers = tuple((int(threshold), _rates(tier)) for threshold, tier in data.get("tiers") or ())
    return Rates(**{**data, "tiers": tiers})


_MEMO: PriceMemo | None = None


def _memo() -> PriceMemo | None:
    """This process's memo of the file RUNNER_PRICE_MEMO names (``off``: None), else of the cache folder's (None
    where that is not an absolute path)."""
    global _MEMO
    path = user_cache.memo_path("RUNNER_PRICE_MEMO", NAME)
    if path is None:
        return None
    if _MEMO is None or _MEMO.path != path:
        _MEMO = PriceMemo(path)
    return _MEMO


def recall(provider_id: str, model_ref: str) -> Remembered | None:
    """The rates remembered for genai-prices' ``provider_id`` and ``model_ref``, or None (none remembered, or an
    entry this code cannot read)."""
    memo = _memo()
    found = memo.recall(provider_id, model_ref) if memo is not None else None
    if found is None:
        return None
    try:
        variants = {label: None if rates is None else _rates(rates) for label, rates in found["variants"].items()}
        return Remembered(provider_id, model_ref, date.fromisoformat(found["since"]), _rates(found["rates"]), variants)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def remember(provider_id: str, model_ref: str, since: date, rates: Rates, variants: dict[str, Rates | None]) -> None:
    """Keep a model's rates, and those of its price contexts, which hold from ``since`` on, for the next process
    (:func:`recall`)."""
    memo = _memo()
    if memo is not None:
        memo.keep(provider_id, model_ref, {
            "since": since.isoformat(),
            "rates": _as_json(rates),
            "variants": {label: None if r is None else _as_json(r) for label, r in variants.items()}})
