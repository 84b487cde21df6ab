"""Explicit final-answer statements: "Answer: C", "Final answer: C", "La réponse est C", "答案是C", "故选B",
"正解はB", "Rating: 6" and, read leniently, "I'd go with C" (:data:`CHOSEN`); :func:`stated_answer` reads the answer
a statement gives, past an adverb ("the answer is clearly C")."""

from __future__ import annotations

import re
from collections.abc import Callable

from runner.evaluate.parsers.lazy import LazyPattern, lazy_compile

from .parsed import Parsed

# final-answer markers: "the answer is", "Answer:", "La réponse est", "答案是", "正确答案：", "答えは", "Rating:"
_MARKER = lazy_compile(
    r"(?P<final>\b(?:final|finale|endgültige|definitive)\s+|最终|最終)?"
    r"(?:\b(?:correct|right|best|richtige|bonne|correcta|correcte|corretta|correta)\s+)?"
    r"(?:\b(?:answer|option|choice|letter|selection|intent|label|class|category|classification|rating|score"
    r"|overall|verdict|judge?ment|réponse|reponse|antwort|respuesta|risposta|resposta|antwoord)\b"
    r"|答案|答え|解答|正解|回答|정답|评分|得分)"
    r"(?:\s+(?:finale?|correcte?|correcta|corretta|correta|juste))?"
    r"(?:\s+(?:to|for|of)\s+(?:this|the)\s+(?:question|item|sentence|problem|utterance|query|task))?"
    r"[\"'*]*(?P<copula>\s+(?:is|would\s+be|should\s+be|must\s+be|will\s+be|seems\s+to\s+be|est|ist|lautet|wäre|es"
    r"|sería|serait|è|é|sarebbe|seria|of)\b|\s*(?:[:=]|-(?!\w)|\u2014|\u2013)|\s*(?:应该|應該|应当|應當|显然|顯然|肯定|就|也|可能|大概|应|應)?(?:是|为|為|は|은|는))",
    re.IGNORECASE,
)
#: Chinese "故选B", "所以选B", "因此应选 C", "答案选B": the formula a worked solution ends with
_CJK_CHOOSE = lazy_compile(
    r"(?:故|所以|因此|因而|于是|於是|综上所述?|綜上所述?|答案|最终|最終)[,\s]*(?:应该?|應該?|应当|應當|可以)?[选選](?:择|擇)?"
    r"(?![项項])[:\s]*"
)
#: words between a marker and the answer that do not stop it: "the answer is clearly C", "is, of course, C", "is
#: most likely B" (a hedge on one answer still chooses it; "B or maybe C" is two)
_ADVERBS = lazy_compile(
    r"(?:[\s,*_]*\b(?:actually|clearly|definitely|obviously|certainly|surely|undoubtedly|unquestionably|indeed|really"
    r"|truly|evidently|plainly|simply|just|still|now|therefore|thus|hence|then|probably|presumably|likely"
    r"|(?:most|very|quite)\s+(?:likely|probably)|almost\s+certainly|possibly|perhaps|maybe|of\s+course"
    r"|without\s+(?:a\s+|any\s+)?doubt|in\s+fact)\b"
    r"|\s*(?:おそらく|たぶん|多分|きっと|明らかに|確かに|显然|顯然|肯定|当然|當然|可能|大概))+[\s,*_]*",
    re.IGNORECASE,
)
#: lenient choices of letters and labels: "I'd go with C", "I choose C", "classified as card_arrival"
CHOSEN = lazy_compile(
    r"(?:\b(?:i|we)(?:'d|'ll|'m|\s+would|\s+will|\s+am|\s+will\s+go)?\s+(?:say|pick|choose|select))\b"
    r"|\b(?:go(?:ing)?\s+with|went\s+with|opt(?:ing)?\s+for|settle\s+on|vote\s+for|choose|chose|pick|select)\b"
    r"|\b(?:classified\s+as|categori[sz]ed\s+as|falls?\s+(?:under|into)|belongs?\s+to)\b"
    r"|我选|选择|應選|应选",
    re.IGNORECASE,
)
#: a determiner before a marker's noun that makes it no statement of the answer
_NOT_THE_ANSWER = lazy_compile(r"\b(?:no|neither|none|any|which|what)\s+$", re.IGNORECASE)
_LINE_START = lazy_compile(r"[\s#>*_\-\"'`{,]*(?:(?:the|my|our|la|le|die|el)\s+)?", re.IGNORECASE)


def _markers(text: str, also: re.Pattern[str] | LazyPattern | None) -> list[tuple[bool, int]]:
    """(strong, end) of each final-answer marker in order: strong when final ("Final answer:"), a JSON key
    (``"answer":``) or a line's own start ("Answer: C", "**Answer:** C")."""
    found = []
    for m in _MARKER.finditer(text):
        if _NOT_THE_ANSWER.search(text, max(0, m.start() - 12), m.start()):
            continue  # "No option is correct", "Which answer is right?": no answer stated
        line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
        colon = m.group("copula").strip() in (":", "=")
        strong = bool(m.group("final")) or (colon and bool(_LINE_START.fullmatch(line)))
        json_key = colon and bool(re.search(r"[\"']\s*[:=]$", m.group()))
        found.append((m.start(), strong or json_key, m.end()))
    found += [(m.start(), bool(re.match(r"最[终終]", m.group())), m.end()) for m in _CJK_CHOOSE.finditer(text)]
    if also is not None:
        found += [(m.start(), False, m.end()) for m in also.finditer(text)]
    return [(strong, end) for _, strong, end in sorted(found)]


def stated_answer(
    text: str, read_at: Callable[[int], Parsed | None], also: re.Pattern[str] | LazyPattern | None = None
) -> Parsed | None:
    """The answer an explicit final-answer statement gives: after the last strong marker that is followed by an
    answer, else after the last other one."""
    marks = _markers(text, also)
    for strong in (True, False):
        for is_strong, end in reversed(marks):
            adverbs = _ADVERBS.match(text, end)
            if is_strong == strong and (got := read_at(adverbs.end() if adverbs else end)) is not None:
                return got
    return None
