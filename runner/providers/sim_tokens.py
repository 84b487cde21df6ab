"""The simulated server's token rule (``runner sim``, simserver/): one token per four characters of text, rounded up,
and 3 more per message and per request. It lives here, with the provider that counts by it, so the runner counts a
``sim:`` request exactly without importing the server; the server answers with the same rule."""

from __future__ import annotations

from typing import Any


def message_text(content: Any) -> str:
    """An OpenAI message content's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def count_tokens(text: str) -> int:
    """Tokens of a text as usage reports them: one per four characters, rounded up."""
    return (len(text) + 3) // 4


def count_prompt_tokens(messages: list[Any]) -> int:
    """The prompt tokens of a request's messages."""
    return 3 + sum(count_tokens(message_text(m.get("content"))) + 3 for m in messages)
