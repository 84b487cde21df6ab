"""The records a provider trades in with the engine: what one request's answer is (:class:`Completion`, with the
rate-limit windows its headers told, :class:`RateWindow`), a log-likelihood answer's scores
(:class:`ContinuationScore`, written into a completion's text by :func:`loglikelihood_completion` and read back by
:func:`parse_loglikelihoods`), the prompt-cache marks a request is sent with (:class:`CacheMarks`) and a prompt
prefix a provider keeps (:class:`StoredPrompt`). Plain data: no provider, setting or SDK. Imported as part of the
provider contract from runner/providers/base.py."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, frozen=True)
class RateWindow:
    """One limit as a response's headers told it: its size, what is left, and seconds until it is full."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None


@dataclass(frozen=True, slots=True)
class CacheMarks:
    """The prompt-cache plan of one request (runner/engine/prompt_cache.py): the group of requests sharing its
    prefix (a digest of that prefix), and where its shared prefixes end, shortest first, each as (message index,
    characters into that message; 0: the end of the message before), with the lifetime to ask for ("5m", "1h")."""

    group: str
    cuts: tuple[tuple[int, int], ...]
    ttl: str = "5m"
    #: a prefix of whole messages the provider keeps for the runner (Gemini's explicit cached contents,
    #: runner/engine/stored_prompts.py): its digest while planned, then ``stored``, the provider's name of it, and
    #: ``held``, how many leading messages it holds (the request then sends only the rest)
    store_key: str | None = None
    stored: str | None = None
    held: int = 0
    #: at most how many input tokens come before the last cut (those the provider may write to its cache); None:
    #: not known, any
    writable: int | None = None


@dataclass(frozen=True, slots=True)
class StoredPrompt:
    """A prompt prefix the provider keeps until ``expires`` (Unix time) under ``name``: ``tokens`` as it counted
    them, and the label the runner gave it (a run's prefixes are found again by their labels)."""

    name: str
    tokens: int
    expires: float
    label: str = ""


@dataclass(slots=True)
class Completion:
    """What came back from one request."""

    text: str
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    #: input tokens written to a prompt cache (Anthropic prices them apart)
    cache_write_tokens: int = 0
    #: of ``cache_write_tokens``, those written for an hour (Anthropic's ``ttl: "1h"``, priced higher again)
    cache_write_1h_tokens: int = 0
    #: the provider's response as JSON-able data, stored in the memo
    raw: dict[str, Any] = field(default_factory=dict)
    #: the model's thinking as the API returned it (thinking blocks, thought parts, ``<think>`` of open models),
    #: kept apart from ``text``, which is the answer alone; None when there was none
    thinking: str | None = None
    #: output tokens spent thinking, where the API reports them (OpenAI reasoning_tokens, Gemini thoughtsTokenCount);
    #: already counted in ``output_tokens``
    reasoning_tokens: int = 0
    #: rate-limit windows from the response headers, by kind: requests, tokens, input_tokens, output_tokens
    rate: dict[str, RateWindow] | None = None
    #: the service tier that served the answer as the API said it (standard, flex, priority:
    #: runner/providers/tiers.py), None when it said none; the engine then takes the tier it sent
    tier: str | None = None
    #: the model the provider says answered (its response's ``model``, Gemini's ``modelVersion``): a dated snapshot
    #: where the job named an alias; None where the API names none (Bedrock's Converse). :func:`stamp` fills it in
    reported_model: str | None = None
    #: what sent the request: the SDK and its version (``openai 3.57.0``), or ``lean wire`` (the runner's own HTTP
    #: client); the engine sets it from the provider (``Provider.sent_with``)
    sent_with: str | None = None
    #: the endpoint of a pooled model's pool that answered (its label: ``sim:b``); the engine sets it, None
    #: outside pools
    endpoint: str | None = None


#: what :attr:`Completion.sent_with` says of a request the runner's own HTTP client sent (runner/providers/lean_http.py)
LEAN_WIRE = "lean wire"
#: the response fields that name the model that answered: OpenAI's and Anthropic's ``model``, Gemini's
#: ``modelVersion`` (``model_version`` as google-genai's objects dump it)
_MODEL_FIELDS = ("model", "modelVersion", "model_version")


@functools.cache
def package_version(package: str | None) -> str | None:
    """``package version`` of an installed distribution (``openai 3.57.0``; boto3 with the botocore under it), None
    when there is none."""
    if package is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = f"{package} {version(package)}"
        return f"{found} (botocore {version('botocore')})" if package == "boto3" else found
    except PackageNotFoundError:
        return package


def stamp(completion: Completion, sent_with: str | None) -> Completion:
    """``completion`` with what produced it, for its result line's provenance: the model its response names (unless
    the provider said) and what sent it."""
    if completion.reported_model is None and isinstance(completion.raw, dict):
        named = next((completion.raw[f] for f in _MODEL_FIELDS if isinstance(completion.raw.get(f), str)), None)
        completion.reported_model = named or None
    completion.sent_with = sent_with
    return completion


@dataclass(slots=True)
class ContinuationScore:
    """How likely a model finds one continuation after its context."""

    logprob: float  # summed natural-log probability of the continuation's tokens given the context
    tokens: int     # how many tokens the continuation has
    greedy: bool    # whether each continuation token was the model's most likely one


def loglikelihood_completion(scores: Iterable[ContinuationScore], input_tokens: int,
                             raw: dict[str, Any] | None = None) -> Completion:
    """The :class:`Completion` of a log-likelihood request: ``text`` is a compact JSON list with one
    ``{"logprob", "tokens", "greedy"}`` object per (context, continuation) pair, in the pairs' order (read it back
    with :func:`parse_loglikelihoods`); ``input_tokens`` are the tokens scored; nothing is generated."""
    items = [{"logprob": float(s.logprob), "tokens": int(s.tokens), "greedy": bool(s.greedy)} for s in scores]
    for item in items:
        if not math.isfinite(item["logprob"]):
            raise ValueError(f"a log-likelihood must be a finite number, not {item['logprob']!r}")
    text = json.dumps(items, separators=(",", ":"), allow_nan=False)
    return Completion(text=text, finish_reason="scored", input_tokens=input_tokens, output_tokens=0,
                      raw=raw if raw is not None else {})


def parse_loglikelihoods(text: str) -> list[ContinuationScore]:
    """The scores a log-likelihood :class:`Completion`'s ``text`` holds; ``ValueError`` if it holds none."""
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return [ContinuationScore(logprob=float(item["logprob"]), tokens=int(item["tokens"]),
                                  greedy=bool(item["greedy"])) for item in items]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a list of log-likelihood scores: {text[:80]!r}") from exc
