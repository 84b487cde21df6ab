"""Answers that choose no option: refusals ("I cannot answer", "As an AI ...") and none-of-them ("None of the
above", "no option fits"), and the slot of a none-of-them option among the offered ones."""

from __future__ import annotations

import re
from collections.abc import Sequence

from runner.evaluate.parsers.lazy import lazy_compile
from runner.plan.choices import NONE_OF_THEM_MARKER

from .text import answer_core, normalised, tokens_of

_REFUSAL = lazy_compile(
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
_KIND = r"(?:option|answer|choice|alternative|label|intent|class|category)"
#: none-of-them statements that name what none of is (the options, the answers...), read in the answer's words
_NONE_NAMED = lazy_compile(
    rf"\bnone\s+of\s+(?:the\s+above|above|(?:the\s+)?(?!others?\b)(?:\w+\s+)?{_KINDS}\b)"
    rf"|\bno\s+(?:correct|valid|suitable|right|matching|appropriate|applicable|good|plausible)\s+{_KIND}"
    rf"|\bno\s+{_KIND}s?\s+(?:is|are|fits?|matches|match|applies|apply|seems?|among|here)\b"
    rf"|\bthere\s+(?:is|are)\s+no\s+(?:\w+\s+)?{_KIND}"
    rf"|\bneither\s+(?:of\s+the\s+\w+|one|{_KIND}s?)\b"
    rf"|\bnot\s+any\s+of\s+(?:the\s+)?(?:\w+\s+)?{_KINDS}\b"
    rf"|\b(?:all(?:\s+of)?(?:\s+the)?(?:\s+\w+)?\s+{_KINDS}|every\s+(?:\w+\s+)?{_KIND})\s+(?:are|is|seem|seems)"
    r"\s+(?:\w+\s+)?(?:wrong|incorrect|false|invalid)\b"
)
#: none-of-them statements that leave it to the question what none of is: "None of them", "none fits"
_NONE_VAGUE = lazy_compile(
    r"\bnone\s+of\s+(?:them|these|those)"
    r"|\bnone\s+(?:is|are|fits?|applies|apply|matches|match)\b"
    r"|\bneither\s+(?:of\s+(?:them|these)|is|fits?|applies|works|matches)\b"
)
_OFFERED = r"(?:options|choices|answers|alternatives|labels|intents|categories|classes)"
_NOT_IN = (
    rf"(?:not|n't|isn't|wasn't)\s+(?:(?:even|actually|really)\s+)?(?:listed\b|among\s+(?:them|these|those)\b"
    rf"|(?:among|one\s+of)\s+(?:the|these|those)\s+(?:\w+\s+)?{_OFFERED}\b|one\s+of\s+(?:them|these|those)\b"
    rf"|in\s+the\s+(?:\w+\s+)?(?:list|{_OFFERED})\b(?!\s+of\b)|(?:there|here)\s*(?:[.!]|$)"
)
#: "the answer is not listed", "the correct one isn't among the choices", "It's not there.", "Not in the list": said
#: of the answer (an answer, option, label... or a sentence's "it"), never "A is not among the options I'd pick"
_NOT_LISTED = lazy_compile(
    rf"\b(?:answer|option|choice|label|intent|class|category|(?:correct|right|true)\s+one)(?:'s\s+|\s+"
    rf"(?:is\s+|was\s+|seems\s+to\s+be\s+)?){_NOT_IN}|(?:given|offered|provided|shown)\b)"
    rf"|(?:^|[.!?;:\n(]\s*)(?:(?:it|that)(?:'s\s+|\s+(?:is\s+|was\s+)?))?{_NOT_IN})"
    rf"|\bis\s+missing\s+from\s+the\s+(?:\w+\s+)?(?:list|{_OFFERED})\b",
    re.IGNORECASE,
)
_EXCEPT = lazy_compile(r"^\s*(?:\w+\s+)?(?:except|but|other\s+than|besides|apart\s+from|save)\b")
_NONE_ALONE = {"none", "neither", "nothing", "none of them", "none applies", "none fits"}


def is_none_of_them(text: str, marker: str = NONE_OF_THEM_MARKER, *, named: bool = False) -> bool:
    """Whether the answer says that no option fits: the marker itself ("none-of-them", any case or separator),
    "None of them/these/the above/the options/the given choices", "no correct option", "no option fits",
    "there is no correct answer", "neither option is correct", "the answer is not listed", "it isn't among the
    choices", "None", "Neither"... but not "none of the others" nor "none of them except B". ``named``: only
    statements that name what none of is ("none of the options", "not listed"), not "none of them" (a yes/no
    answer's "none of them clash" is about the sentence, not the options)."""
    words = " ".join(tokens_of(text))
    if not words:
        return False
    if words in _NONE_ALONE or " ".join(tokens_of(answer_core(text))) in _NONE_ALONE:
        return True
    spots = [m.end() for pattern in (_NONE_NAMED, None if named else _NONE_VAGUE) if pattern
             for m in pattern.finditer(words)]
    mark = tokens_of(marker)
    if mark and not named:
        spots += [m.end() for m in re.finditer(rf"(?<!\S){re.escape(' '.join(mark))}(?!\S)", words)]
    if any(not _EXCEPT.match(words[end:]) for end in spots):
        return True
    text = normalised(text)
    if mark and named and re.search(r"(?:[^\w\s]|_)".join(map(re.escape, mark)), text, re.IGNORECASE):
        return True  # the marker as written ("none-of-them", "N/A"), not its words ("none of them clash")
    return any(not _EXCEPT.match(text[m.end() :]) for m in _NOT_LISTED.finditer(text))


def marker_slot(options: Sequence[str], marker: str) -> int | None:
    if options and (tokens_of(options[-1]) == tokens_of(marker) or is_none_of_them(options[-1], marker)):
        return len(options) - 1
    return None
