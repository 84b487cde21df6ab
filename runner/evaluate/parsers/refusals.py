"""Answers that choose no option: refusals ("I cannot answer", "As an AI ...") and none-of-them ("None of the
above", "no option fits"), and the slot of a none-of-them option among the offered ones."""

from __future__ import annotations

import re
from collections.abc import Sequence

from runner.plan.choices import NONE_OF_THEM_MARKER

from .text import answer_core, normalised, tokens_of

_REFUSAL = re.compile(
    r"\bas\s+an?\s+(?:ai|artificial\s+intelligence|(?:large\s+)?language\s+model|llm|assistant)\b"
    r"|\bi(?:'m|\s+am)\s+(?:sorry|afraid|unable|not\s+able)\b"
    r"|\bi\s+apologi[sz]e\b"
    r"|\bsorry,?\s+(?:but\s+)?i\b"
    r"|\bi\s+(?:cannot|can\s*not|can't|won't|will\s+not|do\s+not|don't)\s+"
    r"(?:answer|help|assist|provide|determine|choose|select|pick|comply|decide|make|judge|evaluate|say|tell"
    r"|give|rate|know|have\s+enough|have\s+access|feel\s+comfortable|fulfil)",
    re.IGNORECASE,
)


def is_refusal(text: str) -> bool:
    """Whether the answer declines ("I cannot answer", "As an AI ...", "I'm sorry", "I don't know")."""
    return bool(_REFUSAL.search(normalised(text)))


_KINDS = (
    r"(?:options?|choices?|answers?|alternatives?|labels?|class(?:es)?|intents?|intent\s+class(?:es)?"
    r"|categor(?:y|ies))"
)
_NONE = re.compile(
    r"\bnone\s+of\s+(?:them|these|those|the\s+above|above"
    rf"|(?:the\s+)?(?!others?\b)(?:\w+\s+)?{_KINDS}\b)"
    r"|\bno\s+(?:correct|valid|suitable|right|matching|appropriate|applicable|good|plausible)\s+"
    r"(?:option|answer|choice|label|intent|class|category)"
    r"|\bno\s+(?:option|answer|choice|label|intent|class|category)s?\s+"
    r"(?:is|are|fits?|matches|match|applies|apply|seems?|among|here)\b"
    r"|\bthere\s+(?:is|are)\s+no\s+(?:\w+\s+)?(?:option|answer|choice|label|intent|class|category)"
    r"|\bnone\s+(?:is|are|fits?|applies|apply|matches|match)\b"
    r"|\bneither\s+of\s+(?:them|these|the\s+\w+)"
)
_EXCEPT = re.compile(r"^\s*(?:\w+\s+)?(?:except|but|other\s+than|besides|apart\s+from|save)\b")
_NONE_ALONE = {"none", "neither", "nothing", "none of them", "none applies", "none fits"}


def is_none_of_them(text: str, marker: str = NONE_OF_THEM_MARKER) -> bool:
    """Whether the answer says that no option fits: the marker itself ("none-of-them", any case or separator),
    "None of them/these/the above/the options/the given choices", "no correct option", "no option fits",
    "there is no correct answer", "None", "Neither"... but not "none of the others" nor "none of them except B"."""
    words = " ".join(tokens_of(text))
    if not words:
        return False
    if words in _NONE_ALONE or " ".join(tokens_of(answer_core(text))) in _NONE_ALONE:
        return True
    spots = [m.end() for m in _NONE.finditer(words)]
    mark = " ".join(tokens_of(marker))
    if mark:
        spots += [m.end() for m in re.finditer(rf"(?<!\S){re.escape(mark)}(?!\S)", words)]
    return any(not _EXCEPT.match(words[end:]) for end in spots)


def marker_slot(options: Sequence[str], marker: str) -> int | None:
    if options and (tokens_of(options[-1]) == tokens_of(marker) or is_none_of_them(options[-1], marker)):
        return len(options) - 1
    return None
