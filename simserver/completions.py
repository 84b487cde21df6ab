"""OpenAI legacy Completions as the simulated server speaks it: ``POST /v1/completions`` with ``echo`` and
``logprobs``, the way evaluation harnesses score a continuation's log-likelihood.

Request: ``model``, ``prompt`` (a string or a non-empty list of strings; token-id prompts are a 400),
``max_tokens`` (default 16, 0 allowed: nothing is generated and ``finish_reason`` is ``"length"``), ``echo``,
``logprobs`` (null or 0-5), ``temperature``, ``top_p``, ``seed``, ``stop`` (a string or up to 4), ``n`` and
``best_of`` (1 only). One choice per prompt, ``index`` in prompt order; ``usage`` sums the prompts.

Tokens. A text is split by the regex ``\\s*\\w+|\\s*[^\\w\\s]|\\s+``: a word with the whitespace before it, a
punctuation mark with the whitespace before it, or trailing whitespace, so ``"".join(tokens(text)) == text``.
``usage`` counts these tokens (prompt tokens: the prompt's; completion tokens: the generated ones), and
``max_tokens`` caps the generated ones.

Log-probabilities. The logprob of token ``t`` after the text ``before`` (everything preceding it: the prompt
and what was generated so far) is drawn from ``sha256(model "\\0" before "\\1" t)``: with ``u`` its first 8
bytes as a fraction in [0, 1), it is ``-(0.05 + 0.45 u)`` (in (-0.5, -0.05]) if the token's stripped,
case-folded text already occurred as a token in ``before``, and ``-(0.5 + 9.5 u)`` (in (-10, -0.5])
otherwise. So it is deterministic, always negative, depends on the token and on all of its context, and a
continuation that repeats its context scores strictly higher than one that does not. Rounded to 6 places.
With ``echo`` the prompt's tokens come first and the very first one has a null logprob (and null
``top_logprobs``), as OpenAI answers; ``text_offset`` counts characters from the start of the prompt, with or
without echo. ``top_logprobs[i]`` holds the ``logprobs`` most likely tokens at that position: the token itself
and alternatives (common words) sharing the remaining probability mass by halves, so they sum to less than 1.

The generated text is the simulated sentence of :mod:`simserver.answers` for the prompt as one user message
(or a response script's text), after a space when the prompt does not end in whitespace, cut at the first stop
string and then at ``max_tokens`` tokens. Rate limits, faults, the key check and /sim/stats work as for chat
completions (counted under the ``openai`` route).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .answers import _WORDS, canonical, fit, reply
from .openai import OpenAIFormat
from .wire import Ask, Invalid, strings

__all__ = ["COMPLETIONS", "CompletionsFormat", "Completion", "token_logprobs", "tokens"]

_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_MAX_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 16


def tokens(text: str) -> list[str]:
    """The simulated tokens of a text; they join back to the text."""
    return _TOKEN.findall(text)


def _key(token: str) -> str:
    return token.strip().casefold()


def _unit(digest: bytes) -> float:
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _scored(model: str, context: str, toks: list[str]) -> list[tuple[float, bytes]]:
    """(logprob, digest) of each token of ``toks`` following ``context`` and the tokens before it."""
    state = hashlib.sha256(model.encode() + b"\0" + context.encode())
    seen = {_key(t) for t in tokens(context)}
    out = []
    for tok in toks:
        probe = state.copy()
        probe.update(b"\1" + tok.encode())
        digest = probe.digest()
        u = _unit(digest)
        key = _key(tok)
        logprob = -(0.05 + 0.45 * u) if key and key in seen else -(0.5 + 9.5 * u)
        out.append((round(logprob, 6), digest))
        seen.add(key)
        state.update(tok.encode())
    return out


def token_logprobs(model: str, text: str, context: str = "") -> list[float]:
    """The logprob of each token of ``text`` after ``context`` (a pure function, for tests and callers)."""
    return [lp for lp, _ in _scored(model, context, tokens(text))]


def _top(token: str, logprob: float, digest: bytes, k: int) -> dict[str, float]:
    """The ``k`` most likely tokens at a position: the token and alternatives sharing the rest by halves."""
    if k == 0:
        return {}
    rest = max(1.0 - math.exp(logprob), 1e-12)
    options = {token: logprob}
    for i in range(k):
        word = " " + _WORDS[digest[8 + i] % len(_WORDS)]
        if word not in options:
            options[word] = round(math.log(rest * 0.5 ** (i + 1)), 6)
    best = sorted(options.items(), key=lambda item: -item[1])[:k]
    return dict(best)


@dataclass(slots=True)
class Completion:
    """What a legacy completions request asks for, beyond the :class:`Ask` fields."""

    prompts: list[str]
    echo: bool
    logprobs: int | None
    max_tokens: int


def _parse_completions(body: Any, request: web.Request | None) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Invalid("You must provide a model parameter.", "model")
    prompt = body.get("prompt")
    if prompt is None:
        raise Invalid("Missing required parameter: 'prompt'.", "prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif strings(prompt) and prompt:
        prompts = list(prompt)
    else:
        raise Invalid("Invalid 'prompt': the simulated server accepts a string or a non-empty list of strings.",
                      "prompt")
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise Invalid(f"The simulated server supports only {name}=1.", name)
    if body.get("stream"):
        raise Invalid("The simulated server does not support streaming.", "stream")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise Invalid("Invalid 'max_tokens': expected an integer of at least 0.", "max_tokens")
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise Invalid("Invalid 'echo': expected a boolean.", "echo")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= _MAX_LOGPROBS):
        raise Invalid(f"Invalid 'logprobs': expected an integer from 0 to {_MAX_LOGPROBS}.", "logprobs")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (strings(stop) and len(stop) <= 4):
        raise Invalid("Invalid 'stop': expected a string or a list of up to 4 strings.", "stop")
    messages = [{"role": "user", "content": p} for p in prompts]
    return Ask(body["model"], messages, body.get("temperature"), max_tokens, body.get("top_p"), stop or None,
               body.get("seed"), Completion(prompts, echo, logprobs, max_tokens))


class CompletionsFormat(OpenAIFormat):
    """OpenAI's key, headers and errors; its own request and answer (:meth:`respond`)."""

    name = "openai"
    parse = staticmethod(_parse_completions)

    def generated(self, ask: Ask, prompt: str, scripted: str | None) -> tuple[str, str]:
        """(generated text, finish_reason) for one prompt."""
        job: Completion = ask.extra
        if job.max_tokens == 0:
            return "", "length"
        if scripted is None:
            messages = [{"role": "user", "content": prompt}]
            scripted = reply(canonical(messages), ask.model, messages, ask.temperature, None, ask.top_p, None,
                             ask.seed)[0]
        text = scripted if not prompt or prompt[-1].isspace() else " " + scripted
        text, finish, _ = fit(text, None, ask.stop)
        toks = tokens(text)
        if len(toks) > job.max_tokens:
            return "".join(toks[:job.max_tokens]), "length"
        return text, finish

    def choice(self, ask: Ask, index: int, prompt: str, scripted: str | None, filtered: bool
               ) -> tuple[dict[str, Any], int, int]:
        """(choice, prompt tokens, completion tokens) for one prompt."""
        job: Completion = ask.extra
        text, finish = ("", "content_filter") if filtered else self.generated(ask, prompt, scripted)
        prompt_toks, gen_toks = tokens(prompt), tokens(text)
        logprobs = None
        if job.logprobs is not None:
            shown: list[str] = []
            lps: list[float | None] = []
            tops: list[dict[str, float] | None] = []
            offsets: list[int] = []
            if job.echo:
                for i, (tok, (lp, digest)) in enumerate(zip(prompt_toks, _scored(ask.model, "", prompt_toks),
                                                            strict=True)):
                    shown.append(tok)
                    lps.append(None if i == 0 else lp)
                    tops.append(None if i == 0 else _top(tok, lp, digest, job.logprobs))
            offset = 0
            for tok in shown:
                offsets.append(offset)
                offset += len(tok)
            offset = len(prompt)
            for tok, (lp, digest) in zip(gen_toks, _scored(ask.model, prompt, gen_toks), strict=True):
                shown.append(tok)
                lps.append(lp)
                tops.append(_top(tok, lp, digest, job.logprobs))
                offsets.append(offset)
                offset += len(tok)
            logprobs = {"tokens": shown, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
        choice = {"text": prompt + text if job.echo else text, "index": index, "logprobs": logprobs,
                  "finish_reason": finish}
        return choice, len(prompt_toks), len(gen_toks)

    def respond(self, ask: Ask, scripted: str | None, filtered: bool) -> dict[str, Any]:
        """The 200 body; ``scripted`` replaces the simulated sentence, ``filtered`` empties the answers."""
        job: Completion = ask.extra
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i, prompt in enumerate(job.prompts):
            choice, p, c = self.choice(ask, i, prompt, scripted, filtered)
            choices.append(choice)
            prompt_tokens += p
            completion_tokens += c
        return {
            "id": "cmpl-" + os.urandom(12).hex(),
            "object": "text_completion",
            "created": int(time.time()),
            "model": ask.model,
            "system_fingerprint": "fp_simserver",
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


COMPLETIONS = CompletionsFormat()
