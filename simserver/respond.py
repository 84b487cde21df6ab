"""The answer body of a parsed request, shared by the online routes and the batch lines, so a batch line gets
exactly what the online endpoint answers for the same body (apart from the random ids and timestamps).

On top of the text (:mod:`simserver.answers`), three things the real APIs do:

Thinking
    A request that thinks (:attr:`Ask.thinking`, decided by each format's ``parse``) spends
    :func:`~simserver.answers.thinking_tokens` before answering: drawn from the messages' digest in its effort's
    range (minimal 8-48, low 24-96, medium or none given 48-192, high 96-384, xhigh and max 192-768), and no more
    than its budget. They count against the output cap as in all three APIs: the answer gets ``cap - thinking``
    tokens, and when thinking fills the cap the answer is empty with the API's length finish reason, its
    thinking tokens billed. The thinking text (:func:`~simserver.answers.thinking_text`) names a wrong option
    letter and the word "no" before settling, so a parser that read it instead of the answer would be caught.
Structured answers
    With a schema (:attr:`Ask.schema`) the text is a JSON instance of it, its option-letter (or any) enum filled
    with the plain text answer when that is a member (:func:`~simserver.answers.schema_instance`); JSON mode
    without a schema answers ``{"answer": plain text}``. A response script's text wins (a test may script invalid
    JSON), and the JSON is cut by the max tokens and stop strings like any text.
Refusals
    A request is refused when the fraction drawn from its messages' digest (SHA-256 of ``"refusal" NUL
    digest``, first 8 bytes over 2**64) is below the ``fault_refusal`` knob, so one prompt is refused every time,
    in every format; and when the script entry says so (an entry with a true ``refusal`` attribute). The model
    then declines with :data:`~simserver.answers.REFUSAL`, billed (with its thinking).
"""

from __future__ import annotations

import hashlib
from typing import Any

from .answers import (
    REFUSAL,
    count_tokens,
    fit,
    fraction,
    structured_text,
    thinking_text,
    thinking_tokens,
    uncut_reply,
)
from .script import Entry
from .wire import Ask, Thought, WireFormat

__all__ = ["answer_body", "refused"]


def refused(digest: str, fault_refusal: float) -> bool:
    """Whether the ``fault_refusal`` draw refuses the messages of this digest (see the module's docstring)."""
    return bool(fault_refusal) and fraction("refusal", digest) < fault_refusal


def answer_body(fmt: WireFormat, ask: Ask, entry: Entry | None, messages_json: str, prompt_tokens: int,
                filtered: bool, fault_refusal: float = 0.0) -> tuple[dict[str, Any], str | None]:
    """(the 200 body, the answer's text or None when filtered or refused); ``entry`` is the matching script entry,
    ``fault_refusal`` the knob (online requests only: the fault knobs do not apply to batch lines)."""
    respond = getattr(fmt, "respond", None)
    if respond is not None:  # a format that builds its whole answer (legacy completions)
        scripted = entry.text() if entry is not None else None
        return respond(ask, scripted, filtered), None if filtered else ""
    if filtered:
        return fmt.answer(ask, None, "content_filter", None, prompt_tokens, 0), None
    if entry is not None:  # a scripted text, cut like a simulated one
        plain = entry.text()
    else:
        plain = uncut_reply(messages_json, ask.model, ask.messages, ask.temperature, ask.max_tokens, ask.top_p,
                            ask.stop, ask.seed)
    digest = hashlib.sha256(messages_json.encode()).hexdigest()
    cap = ask.max_tokens
    spent = thinking_tokens(digest, ask.effort, ask.budget) if ask.thinking else 0
    thought = Thought(spent, thinking_text(ask.messages, plain)) if ask.thinking else None
    if getattr(entry, "refusal", False) or refused(digest, fault_refusal):
        billed = spent + count_tokens(REFUSAL)
        return fmt.answer(ask, None, "stop", None, prompt_tokens, billed if cap is None else min(billed, cap),
                          thought, REFUSAL), None
    full = plain
    if entry is None and (ask.schema is not None or ask.json_object):
        full = structured_text(ask.schema, plain, digest, ask.enum_text)
    if thought is not None and cap is not None and spent >= cap:  # thinking filled the cap: no room to answer
        return fmt.answer(ask, "", "length", None, prompt_tokens, cap, Thought(cap, thought.text)), ""
    room = cap - spent if cap is not None else None
    text, finish, hit = fit(full, room, ask.stop)
    completion_tokens = max(1, count_tokens(text))
    if room is not None:
        completion_tokens = min(completion_tokens, room)
    return fmt.answer(ask, text, finish, hit, prompt_tokens, spent + completion_tokens, thought), text
