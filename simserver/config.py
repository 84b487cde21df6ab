"""The simulated server's knobs (:class:`SimConfig`) and the validation shared by its constructor,
``/sim/config`` and the command line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIELD_KINDS", "SimConfig", "checked_updates"]


@dataclass
class SimConfig:
    """The knobs of the simulated server; every field is also a command-line flag and a /sim/config key."""

    latency: float = 0.0  #: seconds added to each successful response
    rpm: int | None = None  #: requests per minute per model (token bucket); None means unlimited
    tpm: int | None = None  #: tokens per minute per model: input + max tokens (16 when absent) at admission
    itpm: int | None = None  #: input tokens per minute per model (Anthropic-style)
    otpm: int | None = None  #: output tokens per minute per model, charged as max tokens at admission
    fault_429: float = 0.0  #: fraction of requests answered with a rate-limit 429 at random
    retry_after: float = 0.2  #: seconds of retry-after sent with random 429s (fault_429, fault_quota)
    fault_500: float = 0.0  #: fraction answered 500
    fault_503: float = 0.0  #: fraction answered "overloaded" (OpenAI 503, Anthropic 529, Gemini 503)
    fault_401: float = 0.0  #: fraction answered with the format's invalid-key error
    fault_quota: float = 0.0  #: fraction answered "out of credit" (OpenAI 429 insufficient_quota, ...)
    fault_timeout: float = 0.0  #: fraction that hang for hang_seconds before answering
    hang_seconds: float = 30.0
    fault_malformed: float = 0.0  #: fraction answered 200 with a truncated, invalid JSON body
    fault_filter: float = 0.0  #: fraction answered 200 with a content-filtered, empty answer
    #: fraction of prompts the model declines (OpenAI message.refusal, Anthropic stop_reason refusal, Gemini
    #: promptFeedback.blockReason), billed; drawn from the messages' digest, not the RNG (simserver.respond)
    fault_refusal: float = 0.0
    seed: int = 0  #: seeds the fault RNG only; answers never depend on it
    require_key: bool = True  #: reject requests without a non-empty key in the format's own header
    api_key: str | None = field(default=None, repr=False)  #: when set, the only key accepted (missing -> error)
    script: str | None = None  #: a response script file (YAML, see simserver.script) deciding the answers
    #: provider prompt caching as each API does it (simserver.prompt_cache); off: every prompt token uncached
    prompt_cache: bool = True
    #: the fewest tokens a prefix needs to be cached, for every API and model (None: each API's documented minimum)
    cache_min_tokens: int | None = None
    batch_delay: float = 0.0  #: seconds from a batch's creation until it ends (0: done at the first look)
    #: above 0: each batch's turnaround drawn lognormal of this median and ``batch_p95`` (seconds), seeded by ``seed``
    #: and the batch's number since the last reset (simserver.clock), instead of ``batch_delay``
    batch_median: float = 0.0
    batch_p95: float = 0.0
    #: seconds after its creation a batch still running ends expired, its lines done by then answered (the 24 h)
    batch_window: float = 86400.0
    batch_expire: float = 0.0  #: fraction of batch lines (by custom id hash) that expire instead of completing
    batch_line_errors: float = 0.0  #: fraction of batch lines (by custom id hash) answered with a 500 error
    #: refuse what the real APIs refuse, as they do (simserver.strict); ``--lenient`` / ``strict: false`` turns it off
    strict: bool = True
    #: the models the model lookups know, comma-separated (``--models a,b``; a list in /sim/config); None: every
    #: model (simserver.models). Model requests are answered whatever the model.
    models: str | None = None
    #: keep the request log (simserver.request_log, ``GET /sim/log``): every model request, batch and batch line with
    #: its outcome and whether it was billed; off by default, as it grows with every request
    log_requests: bool = False
    #: the token-counting endpoints count (simserver.count_tokens); off: each answers its format's 500, a counting
    #: endpoint that fails
    count_tokens: bool = True
    #: seconds each count request takes to answer (a real count endpoint is a round trip of its own)
    count_latency: float = 0.0
    #: service tiers (simserver.tiers): the fraction of flex requests shed (not billed), the seconds a flex answer
    #: takes beyond ``latency``, and the priority requests per model served at priority (since a reset) before the
    #: rest are served at standard (None: no limit)
    flex_shed: float = 0.0
    flex_latency: float = 0.0
    priority_limit: int | None = None
    #: real seconds per simulated second (simserver.clock): the server's clock runs 1 / time_scale as fast as the
    #: wall, and every duration above (latencies, hangs, retry-after, batch turnarounds, the rate limits' minute) is
    #: scaled so; for tests and benchmarks of deadlines (0.001: a 1-hour batch ends after 3.6 s)
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        checked_updates(dataclasses.asdict(self))


_OPTIONAL = {"rpm": int, "tpm": int, "itpm": int, "otpm": int, "api_key": str, "script": str, "models": str,
             "cache_min_tokens": int, "priority_limit": int}
#: besides the fault_* fields, the fields between 0 and 1
_FRACTIONS = {"batch_expire", "batch_line_errors", "flex_shed"}
#: the fields above 0
_POSITIVE = {"time_scale", "batch_window"}
#: field name -> the type its values take (the command line's ``type=``)
FIELD_KINDS: dict[str, type] = {f.name: _OPTIONAL.get(f.name) or type(f.default)
                                for f in dataclasses.fields(SimConfig)}


def _fraction(name: str) -> bool:
    return name.startswith("fault_") or name in _FRACTIONS


def checked_updates(updates: Any) -> dict[str, Any]:
    """Validate a /sim/config body; raise ValueError or TypeError naming the problem."""
    if not isinstance(updates, dict):
        raise TypeError("config must be a JSON object")
    out: dict[str, Any] = {}
    for name, value in updates.items():
        kind = FIELD_KINDS.get(name)
        if kind is None:
            raise ValueError(f"unknown config field {name!r}")
        if name in _OPTIONAL and value is None:
            out[name] = None
        elif name == "models" and isinstance(value, list):
            if not value or not all(isinstance(model, str) and model and "," not in model for model in value):
                raise ValueError("models must be a non-empty list of model names")
            out[name] = ",".join(value)
        elif kind is str:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")
            out[name] = value
        elif kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false")
            out[name] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value % 1):
            raise ValueError(f"{name} must be a{'n integer' if kind is int else ' number'}")
        elif (value < 0 or (_fraction(name) and value > 1) or (name in _OPTIONAL and value < 1)
              or (name in _POSITIVE and value == 0)):
            raise ValueError(f"{name} must be {'between 0 and 1' if _fraction(name) else 'positive'}")
        else:
            out[name] = kind(value)
    return out
