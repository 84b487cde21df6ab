"""An answer read word by word: each word's place, sentence and clause (:class:`Reader`); where it names an option
or label (:func:`name_mentions`); which names form one list ("A, B or C": :func:`list_bounds`), which it rules out
or only weighs (:func:`ruled_out`); and the one value its last sentence naming any chooses (:func:`choose`)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

from runner.evaluate.parsers.lazy import lazy_compile

from .parsed import Parsed, Reason
from .text import WORD, name_tokens, spelling

_SENTENCE_BREAK = lazy_compile(r"[.!?;\n\u3002]")
#: a clause ends at punctuation, a dash, or a hyphen between spaces ("not A - C")
_CLAUSE_BREAK = lazy_compile(r"[.!?;\n\u3002,:\u3001\u2013\u2014]|\s-+\s")
_DECORATION = lazy_compile(r"[\s*_`\"'(\[{:=<#]*")


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
    "not never neither nor none without instead than unlike eliminate eliminates eliminated eliminating exclude "
    "excludes excluded excluding reject rejects rejected rejecting discard discards discarded out 非".split()
)
_SKIP_BEFORE = frozenset(
    "option options choice choices letter answer label intent class category the a an is it it's its that this be "
    "definitely certainly clearly obviously surely just simply necessarily really probably think believe say "
    "choose pick select go with would will i i'd i'll i'm am and or both either of rule rules ruled ruling about "
    "asking talking related to for".split()
)
_NEGATE_AFTER = frozenset(
    "not never wrong incorrect false invalid implausible unlikely impossible eliminated excluded rejected ruled "
    "discarded irrelevant inaccurate inappropriate distractor distractors cannot".split()
)
_SKIP_AFTER = frozenset(
    "is are was were seems seem looks look appears appear also too clearly definitely obviously certainly surely "
    "simply just can could must should would will may might be been being therefore thus and or nor both option "
    "options the a an then again here probably likely all".split()
)
_WEIGHING = frozenset({"between", "either", "whether"})
#: what a label's verdict after a colon may say: "A: wrong", "B: incorrect"
_VERDICTS = _NEGATE_AFTER - {"not", "never", "cannot"}
#: Chinese and Japanese text is one word between Latin letters: a negation ends the word before a name ("不是A",
#: "排除A") or starts the word after it ("A是错的", "A和B都不对", "Aではない", "Aは間違い")
_CJK_NOT_BEFORE = lazy_compile(r"(?:不是|不选|不選|排除|并非|並非|而非|并不是|並不是|不可能是)(?:选项|選項|答案)?$")
_CJK_NOT_AFTER = lazy_compile(
    r"^(?:是|也|都|就|则|則|は|も|が)?(?:不对|不對|不正确|不正確|错|錯|不是|不行|不可能|可以排除|被排除|排除|误|誤"
    r"|ではな|じゃな|間違|正しくな|違)"
)


def _negates_before(word: str) -> bool:
    return word in _NEGATE_BEFORE or word.endswith("n't") or bool(_CJK_NOT_BEFORE.search(word))


def _negates_after(word: str) -> bool:
    return word in _NEGATE_AFTER or word.endswith("n't") or bool(_CJK_NOT_AFTER.match(word))


def _walk(r: Reader, k: int, step: int, stop: Callable[[str], bool], skip: frozenset[str], names: set[int]) -> bool:
    """From word ``k`` in direction ``step`` within its clause: a word that ``stop`` accepts before any word outside
    ``skip`` and the words of names (``names``: their word indices). Forward, a verdict after a colon counts too
    ("A: wrong")."""
    clause, j = r.clause[k], k + step
    if step == 1 and j < len(r.words) and r.text[r.spans[k][1] : r.starts[j]].strip() == ":":
        return r.lower[j] in _VERDICTS  # "A: wrong", but not "C: not A" nor "7: not bad"
    for _ in range(8):
        if not 0 <= j < len(r.words) or r.clause[j] != clause:
            return False
        word = r.lower[j]
        if stop(word):
            return True
        if word not in skip and j not in names:
            return False
        j += step
    return False


def ruled_out(r: Reader, first: int, last: int, names: set[int]) -> bool:
    """Whether the name (or list of names, :func:`list_bounds`) from word ``first`` to ``last`` is ruled out: "not A",
    "isn't A, B or C", "A is wrong", "A和B都不对"."""
    return _walk(r, first, -1, _negates_before, _SKIP_BEFORE, names) or _walk(
        r, last, 1, _negates_after, _SKIP_AFTER, names
    )


_JOINER = r"(?:and|or|nor|und|oder|et|ou|y|o|和|与|與|或者?|及|跟|还是|還是|と|や)"
_PUNCT = r"[ \t,/&\u3001()\[\]*\"'`]*"
#: what may stand between two names of one list: "A, B", "(C) and (D)", "A, B, or C", "option A or option B", "A/B"
LIST_GAP = lazy_compile(rf"{_PUNCT}(?:{_JOINER}{_PUNCT})?(?:(?:options?|choices?|letters?)[ \t]+{_PUNCT})?",
                       re.IGNORECASE)
_JOINED = lazy_compile(rf"(?<![^\W_]){_JOINER}(?![^\W_])|[/&]", re.IGNORECASE)
_COMMA = lazy_compile(r"[,\u3001]")
#: words after a list that make it one subject even without "and" or "or": "C, D are invalid"
_PLURAL = frozenset("are were both all seem look appear".split())


def list_bounds(r: Reader, spots: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """For each of ``spots`` (first word, last word, value; in order), the first and last word of the list of names
    it belongs to, or its own: names joined by "and", "or", "nor" or a slash ("(C) and (D)"), names between commas
    when an "and" or "or" closes them ("A, B or C"; "Not A, B is right" rules out A alone), and names between commas
    that a plural verb follows ("C, D are invalid")."""
    bounds = [(a, b) for a, b, _ in spots]
    start = 0
    for i in range(1, len(spots) + 1):
        if i < len(spots) and LIST_GAP.fullmatch(r.text[r.spans[spots[i - 1][1]][1] : r.starts[spots[i][0]]]):
            continue
        run = list(range(start, i))  # spots[start:i] are joined by list gaps
        joined = [bool(_JOINED.search(r.text[r.spans[spots[j - 1][1]][1] : r.starts[spots[j][0]]])) or
                  not _COMMA.search(r.text[r.spans[spots[j - 1][1]][1] : r.starts[spots[j][0]]]) for j in run[1:]]
        after = spots[i - 1][1] + 1
        if after < len(r.lower) and r.lower[after] in _PLURAL:
            pieces = [run]
        else:  # a comma-only gap ends a list that an "and" closed, or that no "and" or "or" closes
            pieces, piece = [], [run[0]]
            for n, j in enumerate(run[1:]):
                if not joined[n] and (n > 0 and joined[n - 1] or not any(joined[n + 1 :])):
                    pieces.append(piece)
                    piece = []
                piece.append(j)
            pieces.append(piece)
        for piece in pieces:
            for j in piece:
                bounds[j] = (spots[piece[0]][0], spots[piece[-1]][1])
        start = i
    return bounds


def choose(r: Reader, spots: list[tuple[int, int, int]]) -> Parsed | None:
    """``spots``: (first word, last word, value) of each name in order. Leaving out the names ruled out ("not A",
    "isn't A", "isn't A, B or C", "rule out A", "neither A nor B", "A is wrong", "A and B can be ruled out") and
    those only weighed (in a question, "A or C?"; "between B and D", "either A or C"), the value the last sentence
    naming any names; several there: ambiguous; only weighed ones: ambiguous; none left: None."""
    names = {j for a, b, _ in spots for j in range(a, b + 1)}
    kept, weighed = [], False
    for (a, _, value), (first, last) in zip(spots, list_bounds(r, spots), strict=True):
        if ruled_out(r, first, last, names):
            continue
        if r.question[r.sentence[a]] or _walk(r, first, -1, _WEIGHING.__contains__, frozenset({"and", "or", "the"}),
                                              names):
            weighed = True
            continue
        kept.append((a, value))
    if not kept:
        return Parsed(None, Reason.AMBIGUOUS, "choices only weighed") if weighed else None
    sentence = r.sentence[kept[-1][0]]
    values = {value for k, value in kept if r.sentence[k] == sentence}
    if len(values) == 1:
        return Parsed(values.pop())
    return Parsed(None, Reason.AMBIGUOUS, "two choices named" if len(values) == 2 else "several choices named")


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
    longer = [o for o in spans if o[1] > o[0]]  # only a mention of several words holds another
    spans = [s for s in spans if not any(o[1] - o[0] > s[1] - s[0] and o[0] <= s[0] and s[1] <= o[1] for o in longer)]
    return sorted(spans)
