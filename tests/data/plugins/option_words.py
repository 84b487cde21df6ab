"""An example of one's own parser and scorer (docs/plugins.md, "A parser or a scorer"): a job names them as
``parse: option_words:last_option_named`` and ``scorer: option_words:partial_credit`` with this file beside it."""

from __future__ import annotations

from typing import Any


def last_option_named(answer: str, *, options: list[str], row: dict[str, Any]) -> int | None:
    """The option whose text the answer names last (the index in the order shown), or None when it names none."""
    lowered = answer.lower()
    found = [(lowered.rfind(option.lower()), index) for index, option in enumerate(options)
             if option.lower() in lowered]
    if not found:
        if "no idea" in lowered:
            raise ValueError("the model said it has no idea")
        return None
    return max(found)[1]


def partial_credit(parsed: Any, gold: Any) -> float:
    """Full credit for the gold option, half for its neighbour in the original order."""
    if parsed == gold:
        return 1.0
    return 0.5 if abs(parsed - gold) == 1 else 0.0
