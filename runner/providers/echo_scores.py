"""A continuation's log-likelihood from a legacy Completions answer that echoed its prompt with logprobs
(``echo=True, logprobs=1``), as ``OpenAIChatProvider.loglikelihood`` asks the OpenAI-format servers for it
(``runner/providers/openai_chat.py``'s docstring says how)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import ContinuationScore

__all__ = ["score_echoed"]


def score_echoed(logprobs: Mapping[str, Any], prompt: str, context_length: int) -> ContinuationScore:
    """The continuation's score from one echoed choice's ``logprobs`` (``tokens``, ``token_logprobs``,
    ``text_offset``, ``top_logprobs``) for ``prompt`` = context + continuation.

    The prompt's tokens are those whose ``text_offset`` is inside the prompt (the generated ones come after it).
    The continuation starts at the first of them at or after the context's end, or at the token before when that
    one straddles the boundary (a context ending in a space merged with the continuation's first word: the
    token holds the continuation's first character, and is scored as the embedded model scores it). ``greedy``:
    every continuation token is the most likely one of its ``top_logprobs``; False when those are missing.
    ``ValueError`` when a continuation token has no logprob (the prompt's first token never has one)."""
    offsets = list(logprobs.get("text_offset") or [])
    values = list(logprobs.get("token_logprobs") or [])
    tops = list(logprobs.get("top_logprobs") or [])
    if len(values) != len(offsets):
        raise ValueError("token_logprobs and text_offset differ in length")
    prompt_tokens = sum(1 for offset in offsets if offset < len(prompt))
    start = next((i for i in range(prompt_tokens) if offsets[i] >= context_length), prompt_tokens)
    if start > 0:
        end_before = offsets[start] if start < prompt_tokens else len(prompt)
        if offsets[start - 1] < context_length < end_before:
            start -= 1
    total, greedy = 0.0, True
    for i in range(start, prompt_tokens):
        value = values[i]
        if value is None:
            raise ValueError("the continuation starts at the prompt's first token, which has no logprob; give it a "
                             "non-empty context")
        total += float(value)
        top = tops[i] if i < len(tops) else None
        # values may be rounded (to 6 places by some servers): a tie within that is still the most likely
        if not top or float(value) < max(float(v) for v in top.values()) - 1e-6:
            greedy = False
    return ContinuationScore(logprob=total, tokens=prompt_tokens - start, greedy=greedy)
