"""Explicit final-answer statements: "Answer: C", "Final answer: C", "La réponse est C", "答案是C", "Rating: 6" and,
read leniently, "I'd go with C" (:data:`CHOSEN`); :func:`stated_answer` reads the answer a statement gives."""

from __future__ import annotations

import re
from collections.abc import Callable

from .parsed import Parsed

# final-answer markers: "the answer is", "Answer:", "La réponse est", "答案是", "正确答案：", "答えは", "Rating:"
_MARKER = re.compile(
    r"(?P<final>\b(?:final|finale|endgültige|definitive)\s+|最终|最終)?"
    r"(?:\b(?:correct|right|best|richtige|bonne|correcta|correcte|corretta|correta)\s+)?"
    r"(?:\b(?:answer|option|choice|letter|selection|intent|label|class|category|classification|rating|score"
    r"|overall|verdict|judge?ment|réponse|reponse|antwort|respuesta|risposta|resposta|antwoord)\b"
    r"|答案|答え|解答|正解|回答|정답|评分|得分)"
    r"(?:\s+(?:finale?|correcte?|correcta|corretta|correta|juste))?"
    r"(?:\s+(?:to|for|of)\s+(?:this|the)\s+(?:question|item|sentence|problem|utterance|query|task))?"
    r"[\"'*]*(?P<copula>\s+(?:is|would\s+be|should\s+be|must\s+be|will\s+be|seems\s+to\s+be|est|ist|lautet|wäre|es"
    r"|sería|serait|è|é|sarebbe|seria|of)\b|\s*(?:[:=]|-(?!\w)|\u2014|\u2013)|\s*(?:是|为|為|は|은|는))",
    re.IGNORECASE,
)
#: lenient choices of letters and labels: "I'd go with C", "I choose C", "classified as card_arrival"
CHOSEN = re.compile(
    r"(?:\b(?:i|we)(?:'d|'ll|'m|\s+would|\s+will|\s+am|\s+will\s+go)?\s+(?:say|pick|choose|select))\b"
    r"|\b(?:go(?:ing)?\s+with|went\s+with|opt(?:ing)?\s+for|settle\s+on|vote\s+for|choose|chose|pick|select)\b"
    r"|\b(?:classified\s+as|categori[sz]ed\s+as|falls?\s+(?:under|into)|belongs?\s+to)\b"
    r"|我选|选择|應選|应选",
    re.IGNORECASE,
)
_LINE_START = re.compile(r"[\s#>*_\-\"'`{,]*(?:(?:the|my|our|la|le|die|el)\s+)?", re.IGNORECASE)


def _markers(text: str, also: re.Pattern[str] | None) -> list[tuple[bool, int]]:
    """(strong, end) of each final-answer marker in order: strong when final ("Final answer:"), a JSON key
    (``"answer":``) or a line's own start ("Answer: C", "**Answer:** C")."""
    found = []
    for m in _MARKER.finditer(text):
        line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
        colon = m.group("copula").strip() in (":", "=")
        strong = bool(m.group("final")) or (colon and bool(_LINE_START.fullmatch(line)))
        json_key = colon and bool(re.search(r"[\"']\s*[:=]$", m.group()))
        found.append((m.start(), strong or json_key, m.end()))
    if also is not None:
        found += [(m.start(), False, m.end()) for m in also.finditer(text)]
    return [(strong, end) for _, strong, end in sorted(found)]


def stated_answer(
    text: str, read_at: Callable[[int], Parsed | None], also: re.Pattern[str] | None = None
) -> Parsed | None:
    """The answer an explicit final-answer statement gives: after the last strong marker that is followed by an
    answer, else after the last other one."""
    marks = _markers(text, also)
    for strong in (True, False):
        for is_strong, end in reversed(marks):
            if is_strong == strong and (got := read_at(end)) is not None:
                return got
    return None
