"""Integer ratings on a scale (:func:`parse_scale`): the scale itself is no rating, "N/10" and "N out of 10" are."""

from __future__ import annotations

import bisect
import re

from runner.evaluate.parsers.lazy import lazy_compile

from .parsed import Parsed, Reason
from .reader import Reader, choose
from .refusals import is_refusal
from .statements import stated_answer
from .text import answer_core, graded_text, tokens_of

#: ratings given: "I'd give it 6", "rate it a 7", "gets a 3", "deserves a 9"
_RATED = lazy_compile(
    r"\b(?:give|gives|giving|gave|rate|rates|rated|score|scores|scored|gets|get|got|deserves|deserve|assign|assigns"
    r"|award|awards)\b(?:\s+(?:it|this|that|this\s+sentence|the\s+sentence|this\s+one))?(?:\s+(?:a|an|as|at))?",
    re.IGNORECASE,
)
_INTEGER = lazy_compile(r"(?<![\w.\-])(-?\d+)(?!\w|[.,]\d)")
_NUMBER_WORDS = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_DENOMINATOR = lazy_compile(r"(?:out\s+of|/)\s*$", re.IGNORECASE)
_RATING_AT = lazy_compile(r"[\s*_`\"'(\[{:=]*(?:(?:a|an|of)\s+)?(?:(-?\d+)(?!\w|[.,]\d)|([a-z]+)\b)", re.IGNORECASE)


def _scale_statement(low: int, high: int) -> re.Pattern[str]:
    """"0 to 10", "from 1-10", "between 0 and 10", "(0-10)", "zero to ten", "with 10 being fully logical",
    "0 = illogical": the scale, not a rating."""
    starts = {str(n) for n in (low, 0, 1) if n < high}
    starts |= {word for word, n in _NUMBER_WORDS.items() if str(n) in starts}
    ends = {str(high)} | {word for word, n in _NUMBER_WORDS.items() if n == high}
    first, last, either = "|".join(sorted(starts)), "|".join(sorted(ends)), "|".join(sorted(starts | ends))
    return re.compile(
        rf"(?<![\w.\-])(?:(?:{first})\s*(?:-|\u2013|\u2014|to|through|and)\s*(?:{last})(?![\w.]\d|\w)"
        rf"|(?:{either})\s*(?:(?:being|meaning|means|represents|indicates|stands\s+for)\b|=))",
        re.IGNORECASE,
    )


def parse_scale(text: str, low: int = 0, high: int = 10) -> Parsed:
    """An integer rating in ``[low, high]``: the whole answer, else "N/high" or "N out of high", else after
    "Rating:"/"score is"/"I'd give it", else the integers of the last sentence naming any (out-of-range ones are
    skipped; the scale's own bounds and denominators are not ratings; decimals such as "7.5" are not integers),
    else a number word ("eight"). Integers seen but none in range -> ``out_of_range``; "7 or 8" -> ``ambiguous``.
    Thresholds (keep >= 8, <= 3) are :func:`runner.evaluate.score.threshold`."""
    answer = graded_text(text)
    if answer is None:
        return Parsed(None, Reason.EMPTY)

    def rated(n: int) -> Parsed:
        return Parsed(n) if low <= n <= high else Parsed(None, Reason.OUT_OF_RANGE)

    core, first_line = answer_core(answer), answer_core(answer.strip().splitlines()[0])
    for whole in (core, first_line):  # the rating alone, or on the first line before its explanation
        if re.fullmatch(r"-?\d+(?:\.0+)?", whole):
            return rated(int(float(whole)))
    plain = _scale_statement(low, high).sub(" ", answer)
    out_of = re.search(rf"(?<![\w.\-])(-?\d+)\s*(?:/|out\s+of)\s*{high}\b", plain, re.IGNORECASE)
    if out_of:
        return rated(int(out_of.group(1)))
    for hedge in re.finditer(r"(?<![\w.\-])(\d+)\s*(?:-|\u2013|to|or|and)\s*(\d+)(?!\w|[.,]\d)", plain):
        if all(low <= int(n) <= high for n in hedge.groups()) and hedge.group(1) != hedge.group(2):
            return Parsed(None, Reason.AMBIGUOUS)

    def read_at(offset: int) -> Parsed | None:
        m = _RATING_AT.match(plain, offset)
        if m and m.group(1):
            return rated(int(m.group(1)))
        if m and m.group(2) and m.group(2).lower() in _NUMBER_WORDS:
            return rated(_NUMBER_WORDS[m.group(2).lower()])
        return None

    stated = stated_answer(plain, read_at, _RATED)
    if stated is not None:
        return stated
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    r = Reader(plain)
    integers = [
        (bisect.bisect_left(r.starts, m.start()), int(m.group(1)))
        for m in _INTEGER.finditer(plain)
        if not _DENOMINATOR.search(plain[max(0, m.start() - 12) : m.start()])
    ]
    found = choose(r, [(k, k, n) for k, n in integers if low <= n <= high])
    if found is not None:
        return found
    if integers:
        return Parsed(None, Reason.OUT_OF_RANGE)
    for word in tokens_of(plain):
        if word in _NUMBER_WORDS:
            return rated(_NUMBER_WORDS[word])
    return Parsed(None, Reason.NOT_FOUND)
