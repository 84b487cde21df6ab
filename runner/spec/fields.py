"""What every model of the job file shares: the base that refuses unknown keys, the bounds of the integers that
size a job's work, each said in one sentence when a value is out of them, and the durations and deadlines the job
writes as text ("90m", "6h", "2026-12-01T18:00Z")."""

from __future__ import annotations

import datetime as dt
import time
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from runner.lazy_re import lazy_compile

# Bounds of the integers that size a job's work or go into a request: beyond them a value is a typo, a job that
# would never finish planning, or a number no API, SQLite column or clock takes. Said as "must be from A to B".
#: output tokens of one answer (no model in the capability table writes more than 272,000)
MAX_TOKENS = 1_000_000
#: rows a stage (or the job) may be limited to
MAX_ROWS = 1_000_000_000
#: samples of one prompt
MAX_SAMPLES = 1_000
#: choice seeds of a stage
MAX_SEEDS = 1_000
#: requests per row and model: choice seeds x samples x every variants: axis
MAX_VARIANTS = 10_000
#: counts of the data steps (sample n, top_k k, max_items, sample_offset)
MAX_COUNT = 1_000_000_000
#: a seed: what a 64-bit integer holds (OpenAI's seed, SQLite's INTEGER)
SEED_RANGE = (-(2**63), 2**63 - 1)
#: a budget in tokens
MAX_BUDGET_TOKENS = 10**15
#: a deadline, in seconds (a year)
MAX_DEADLINE = 366 * 86400.0


def within(low: int, high: int) -> AfterValidator:
    """An integer field's range, said in one sentence ("must be from 1 to 1,000") instead of pydantic's two."""
    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be from {low:,} to {high:,}")
        return value
    check.bounds = (low, high)  # type: ignore[attr-defined]  # read by scripts/gen_reference.py
    return AfterValidator(check)


def seeds_within(value: list[int]) -> list[int]:
    """A stage's choice seeds: from 1 to :data:`MAX_SEEDS` of them, each a 64-bit integer."""
    if not 1 <= len(value) <= MAX_SEEDS:
        raise ValueError(f"must list from 1 to {MAX_SEEDS:,} seeds, not {len(value):,}")
    for seed in value:
        if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise ValueError(f"seed {seed} is not from {SEED_RANGE[0]:,} to {SEED_RANGE[1]:,}")
    return value


Seed = Annotated[int, within(*SEED_RANGE)]


class Strict(BaseModel):
    # populate_by_name: a job stored as JSON for resume is written with field names (``from_``, ``as_``)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


_DURATION = lazy_compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def is_duration(text: str) -> bool:
    """Whether ``text`` has a duration's form (:func:`parse_duration` may still find it too long)."""
    return _DURATION.match(str(text)) is not None


def parse_duration(text: str) -> float:
    """``"90m"`` → 5400.0; a bare number is seconds. ValueError names the forms it takes."""
    found = _DURATION.match(str(text))
    if not found:
        raise ValueError(f"{text!r} is not a duration: write seconds, or a number with s, m, h or d (e.g. 6h)")
    seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2) or "s"]
    if seconds > MAX_DEADLINE:
        raise ValueError("more than a year: a duration must be at most 366d")
    return seconds


#: the start of an ISO 8601 date: a deadline that is a time rather than a duration
_ABSOLUTE = lazy_compile(r"^\s*\d{4}-\d{2}-\d{2}[T ]")


def absolute_time(text: str) -> float | None:
    """An ISO 8601 time with its zone as epoch seconds; None when ``text`` is not one (a duration, or nothing). A
    time without a zone is a ValueError: whose clock it means is not known."""
    if not _ABSOLUTE.match(str(text)):
        return None
    try:
        moment = dt.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (6h) nor an ISO 8601 time (2026-12-01T18:00Z)") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: add one (2026-12-01T18:00Z, or +01:00)")
    return moment.timestamp()


def deadline_seconds(text: str, now: float | None = None) -> float:
    """A deadline as seconds from ``now`` (epoch seconds, default the clock): a duration as it is, an absolute
    time less ``now`` (negative when past; ``now`` 0 checks only its form). ValueError in one sentence."""
    moment = absolute_time(text)
    if moment is None:
        if not is_duration(text):
            raise ValueError(f"{str(text)!r} is not a deadline: write a duration (seconds, or a number with s, m, h "
                             "or d, e.g. 6h) or an ISO 8601 time with its zone (2026-12-01T18:00Z)")
        return parse_duration(text)  # one too long says so
    if now == 0.0:
        return moment
    return moment - (time.time() if now is None else now)
