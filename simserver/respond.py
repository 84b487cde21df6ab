"""The answer body of a parsed request, shared by the online routes and the batch lines, so a batch line gets
exactly what the online endpoint answers for the same body (apart from the random ids and timestamps)."""

from __future__ import annotations

from typing import Any

from .answers import count_tokens, fit, reply
from .script import Entry
from .wire import Ask, WireFormat

__all__ = ["answer_body"]


def answer_body(fmt: WireFormat, ask: Ask, entry: Entry | None, messages_json: str, prompt_tokens: int,
                filtered: bool) -> tuple[dict[str, Any], str | None]:
    """(the 200 body, the answer's text or None when filtered); ``entry`` is the matching script entry."""
    respond = getattr(fmt, "respond", None)
    if respond is not None:  # a format that builds its whole answer (legacy completions)
        scripted = entry.text() if entry is not None else None
        return respond(ask, scripted, filtered), None if filtered else ""
    if filtered:
        text, finish, hit, completion_tokens = None, "content_filter", None, 0
    else:
        if entry is not None:  # a scripted text, cut like a simulated one
            text, finish, hit = fit(entry.text(), ask.max_tokens, ask.stop)
        else:
            text, finish, hit = reply(messages_json, ask.model, ask.messages, ask.temperature, ask.max_tokens,
                                      ask.top_p, ask.stop, ask.seed)
        completion_tokens = max(1, count_tokens(text))
        if ask.max_tokens is not None:
            completion_tokens = min(completion_tokens, ask.max_tokens)
    return fmt.answer(ask, text, finish, hit, prompt_tokens, completion_tokens), text
