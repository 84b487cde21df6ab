"""An answer read word by word: each word's place, sentence and clause (:class:`Reader`); where it names an option
or label (:func:`name_mentions`); which names it rules out or only weighs (:func:`ruled_out`); and the one value
its last sentence naming any chooses (:func:`choose`)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from .parsed import Parsed, Reason
from .text import WORD, name_tokens, spelling

_SENTENCE_BREAK = re.compile(r"[.!?;\n\u3002]")
_CLAUSE_BREAK = re.compile(r"[.!?;\n\u3002,:\u3001\u2013\u2014]")
_DECORATION = re.compile(r"[\s*_`\"'(\[{:=<#]*")


class Reader:
    """An answer's words with their places, and the sentence and clause each belongs to."""

    __slots__ = ("clause", "lower", "question", "sentence", "spans", "starts", "text", "words")

    def __init__(self, text: str) -> None:
        self.text = text
        found = list(WORD.finditer(text))
        self.spans = [m.span() for m in found]
        self.starts = [a for a, _ in self.spans]
        self.words = [m.group() for m in found]
        self.lower = [spelling(w.lower()) for w in self.words]
        self.sentence: list[int] = []
        self.clause: list[int] = []
        self.question: list[bool] = [False]  # per sentence: it ends with "?"
        end = 0
        for start, stop in [*self.spans, (len(text), len(text))]:
            gap = text[end:start]
            ended = _SENTENCE_BREAK.search(gap)
            if ended and start < len(text):
                self.question[-1] = ended.group() == "?"
                self.question.append(False)
            elif ended:
                self.question[-1] = ended.group() == "?"
            if start < len(text):
                self.sentence.append(len(self.question) - 1)
                self.clause.append((self.clause[-1] if self.clause else 0) + bool(_CLAUSE_BREAK.search(gap)))
            end = stop

    def at(self, offset: int, lead_in: frozenset[str] = frozenset()) -> int | None:
        """The first word at ``offset`` with only decoration (and lead-in words) before it."""
        k, pos = bisect.bisect_left(self.starts, offset), offset
        while k < len(self.words) and _DECORATION.fullmatch(self.text[pos : self.starts[k]]):
            if self.lower[k] not in lead_in:
                return k
            pos, k = self.spans[k][1], k + 1
        return None

    def ends_statement(self, k: int) -> bool:
        """Whether word ``k`` ends its statement: the text ends, or punctuation or a line break follows it."""
        after = self.text[self.spans[k][1] : self.starts[k + 1] if k + 1 < len(self.words) else len(self.text)]
        return k + 1 == len(self.words) or bool(after.strip(" \t"))


_NEGATE_BEFORE = frozenset(
    "not never neither nor without instead than unlike eliminate eliminates eliminated eliminating exclude "
    "excludes excluded excluding reject rejects rejected rejecting discard discards discarded out".split()
)
_SKIP_BEFORE = frozenset(
    "option options choice choices letter answer label intent class category the a an is it it's its that this be "
    "definitely certainly clearly obviously surely just simply necessarily really probably think believe say "
    "choose pick select go with would will i i'd i'll i'm am and or both either of rule rules ruled ruling about "
    "asking talking related to for".split()
)
_NEGATE_AFTER = frozenset(
    "not never wrong incorrect false invalid implausible unlikely impossible eliminated excluded rejected ruled "
    "discarded irrelevant inaccurate inappropriate distractor cannot".split()
)
_SKIP_AFTER = frozenset(
    "is are was were seems seem looks look appears appear also too clearly definitely obviously certainly surely "
    "simply just can could must should would will may might be been being therefore thus and or nor both option "
    "options the a an then again here probably likely".split()
)
_WEIGHING = frozenset({"between", "either", "whether"})


def _walk(r: Reader, k: int, step: int, stop: frozenset[str], skip: frozenset[str], names: set[int]) -> bool:
    """From word ``k`` in direction ``step`` within its clause: a word of ``stop`` (or ``-n't``) before any word
    outside ``skip`` and the words of names (``names``: their word indices)."""
    clause, j = r.clause[k], k + step
    for _ in range(8):
        if not 0 <= j < len(r.words) or r.clause[j] != clause:
            return False
        word = r.lower[j]
        if word in stop or ("n't" in stop and word.endswith("n't")):
            return True
        if word not in skip and j not in names:
            return False
        j += step
    return False


def ruled_out(r: Reader, first: int, last: int, names: set[int]) -> bool:
    return _walk(r, first, -1, _NEGATE_BEFORE | {"n't"}, _SKIP_BEFORE, names) or _walk(
        r, last, 1, _NEGATE_AFTER | {"n't"}, _SKIP_AFTER, names
    )


def choose(r: Reader, spots: list[tuple[int, int, int]]) -> Parsed | None:
    """``spots``: (first word, last word, value) of each name in order. Leaving out the names ruled out ("not A",
    "isn't A", "rule out A", "neither A nor B", "A is wrong", "A and B can be ruled out") and those only weighed (in
    a question, "A or C?"; "between B and D", "either A or C"), the value the last sentence naming any names;
    several there: ambiguous; only weighed ones: ambiguous."""
    names = {j for a, b, _ in spots for j in range(a, b + 1)}
    kept, weighed = [], False
    for a, b, value in spots:
        if ruled_out(r, a, b, names):
            continue
        if r.question[r.sentence[a]] or _walk(r, a, -1, _WEIGHING, frozenset({"and", "or", "the"}), names):
            weighed = True
            continue
        kept.append((a, value))
    if not kept:
        return Parsed(None, Reason.AMBIGUOUS) if weighed else None
    last = r.sentence[kept[-1][0]]
    values = {value for k, value in kept if r.sentence[k] == last}
    return Parsed(values.pop()) if len(values) == 1 else Parsed(None, Reason.AMBIGUOUS)


def name_mentions(r: Reader, names: Sequence[str]) -> list[tuple[int, int, int]]:
    """(first word, last word, name index) of every whole-word mention of a name, in order, leaving out a mention
    inside the mention of a longer name ("apple" inside "apple pie")."""
    starts: dict[str, list[int]] = {}
    for k, word in enumerate(r.lower):
        starts.setdefault(word, []).append(k)
    spans = []
    for i, name in enumerate(names):
        needle = name_tokens(name)
        for a in starts.get(needle[0], []) if needle else []:
            if tuple(r.lower[a : a + len(needle)]) == needle:
                spans.append((a, a + len(needle) - 1, i))
    spans = [s for s in spans if not any(o[1] - o[0] > s[1] - s[0] and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    return sorted(spans)
