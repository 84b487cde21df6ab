"""What the simulated server answers: deterministic text, token counts and the message digest.

Answers depend only on (model, messages, temperature, max tokens, top_p, stop, seed), hashed as canonical
JSON. Anthropic and Gemini requests are first mapped to the OpenAI message list they mean: the system prompt
(``system``; ``systemInstruction`` parts) becomes a leading ``{"role": "system", "content": text}``, every turn
``{"role": "user"|"assistant", "content": text}`` (Gemini's ``model`` is the assistant) with text blocks or
parts joined, and ``stop_sequences``/``stopSequences``, ``max_tokens``/``maxOutputTokens`` fill the OpenAI
fields. So a conversation whose OpenAI contents are plain strings gets the same text, and the same key in
``completed_by_digest`` (SHA-256 of that list as canonical JSON), in every format. Integral floats count as
integers (google-genai sends ``temperature=0`` as ``0.0``). If the last user message lists options on their
own lines ("A. ..." or "A) ..."), the answer is one of the offered letters; otherwise a sentence of 8-30 words.
The max tokens (one token per word) truncate it (finish ``length`` / ``max_tokens`` / ``MAX_TOKENS``); stop
strings cut it (Anthropic reports ``stop_sequence``). Completion tokens never exceed the max tokens. A
response script (:mod:`simserver.script`) replaces only the text: :func:`fit` cuts it the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

__all__ = ["canonical", "count_prompt_tokens", "count_tokens", "fit", "message_digest", "reply", "request_text",
           "simulated_reply"]

_MC_OPTION = re.compile(r"(?m)^\s*([A-Z])[.)]\s")
#: options written "A: text" (Know-No's MC-Test prompt), looked for only when no "A." / "A)" options are found
_MC_OPTION_COLON = re.compile(r"(?m)^\s*([A-Z]):\s")
_WORDS = (
    "the", "a", "model", "answer", "result", "token", "quick", "careful", "simple", "clear", "short",
    "long", "data", "value", "test", "run", "paper", "term", "option", "question", "choice", "reason",
    "evidence", "context", "meaning", "sentence", "word", "number", "example", "likely", "plausible",
    "cause", "effect", "because", "therefore", "however", "indeed", "often", "rarely", "always", "never",
    "first", "second", "third", "final", "small", "large", "new", "old", "early", "late", "good", "fair",
    "exact", "rough", "useful", "system", "request", "server", "client", "cache", "budget", "limit",
    "retry", "window", "stream", "batch", "job", "stage", "seed",
)
# Built once: json.dumps() would build an encoder per call, and this is the hot path.
canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _text_of(content: Any) -> str:
    """An OpenAI message content's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def request_text(messages: list[Any]) -> str:
    """Every message's text, in order (the system prompt first), joined with newlines."""
    return "\n".join(_text_of(m.get("content")) for m in messages)


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def message_digest(messages: list[Any]) -> str:
    """The key of /sim/stats' completed_by_digest: SHA-256 of the messages list as canonical JSON."""
    return hashlib.sha256(canonical(messages).encode()).hexdigest()


def simulated_reply(model: str, messages: list[Any], temperature: Any = None, max_tokens: int | None = None,
                    top_p: Any = None, stop: Any = None, seed: Any = None) -> tuple[str, str]:
    """The (content, finish_reason) the server answers for these request fields; a pure function."""
    return reply(canonical(messages), model, messages, temperature, max_tokens, top_p, stop, seed)[:2]


def reply(messages_json: str, model: str, messages: list[Any], temperature: Any, max_tokens: int | None,
          top_p: Any, stop: Any, seed: Any) -> tuple[str, str, str | None]:
    """(text, "stop"|"length", the stop string that cut the text or None)."""
    # The messages' canonical JSON is passed in because the server also needs it for the digest.
    params = canonical([model, _number(temperature), max_tokens, _number(top_p), stop, seed])
    h = hashlib.sha256(f"{params}{messages_json}".encode()).digest()
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    content = _text_of(last.get("content"))
    letters = list(dict.fromkeys(_MC_OPTION.findall(content)))
    if len(letters) < 2:
        letters = list(dict.fromkeys(_MC_OPTION_COLON.findall(content)))
    if len(letters) >= 2:
        text = letters[h[0] % len(letters)]
    else:
        # Byte 1 picks the length (8-30 words), bytes 2..31 pick the words.
        words = [_WORDS[b % len(_WORDS)] for b in h[2:2 + 8 + h[1] % 23]]
        text = " ".join(words).capitalize() + "."
    return fit(text, max_tokens, stop)


def fit(text: str, max_tokens: int | None, stop: Any) -> tuple[str, str, str | None]:
    """An answer's text cut by the stop strings and the max tokens (one per word): (text, "stop"|"length",
    the stop string that cut the text or None)."""
    hit = None
    if stop:
        cuts = [(i, s) for s in ([stop] if isinstance(stop, str) else stop) if s and (i := text.find(s)) >= 0]
        if cuts:
            cut, hit = min(cuts)
            text = text[:cut]
    if max_tokens is not None:
        words = text.split(" ")
        if len(words) > max_tokens:
            return " ".join(words[:max_tokens]), "length", None
    return text, "stop", hit


def count_tokens(text: str) -> int:
    """Tokens of a text as usage reports them: one per four characters, rounded up."""
    return (len(text) + 3) // 4


def count_prompt_tokens(messages: list[Any]) -> int:
    return 3 + sum(count_tokens(_text_of(m.get("content"))) + 3 for m in messages)
