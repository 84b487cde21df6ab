"""Answer parsers: read a model's final answer as a careful human grader would. Each returns a :class:`Parsed`: a
value, or ``None`` with the reason class it is invalid.

Reason classes (:class:`Reason`): ``empty``, ``refusal``, ``not_found`` (nothing recognisable), ``not_strict``
(strict mode: no explicit letter), ``ambiguous`` (a hedge, or several options, labels or numbers named alike),
``out_of_range`` (a letter or number outside the offered ones, e.g. "D. Rick" with options A-C), ``none_of_them``
(the answer says no option fits, but no none-of-them option was offered), ``conflict`` (yes and no, with
``conflict="invalid"``). Invalid answers are scored wrong.

How an answer is read, in one place:

1. **The answer's text.** Thinking is removed first: ``<think>...</think>``, ``<thinking>...</thinking>``,
   ``<reasoning>...</reasoning>``, everything before a closing tag whose opening tag was in the prompt, and an
   unclosed leading ``<think>`` block (then the answer never came: ``empty``). A JSON object with an answer field
   (``answer``, ``final_answer``, ``choice``, ``label``, ``intent``, ``rating``, ``score``, ``verdict``...) is read as
   that field; a LaTeX ``\\boxed{...}`` as its content (``\\text{}`` unwrapped). Characters are normalised (NFKC, so
   full-width "Ｃ" is "C"; curly quotes), and Chinese or Japanese text is split from Latin letters ("答案是C").
2. **An explicit final-answer statement wins.** "Answer: C", "Final answer: C", "The correct option is (C).",
   "the intent is card_arrival", "Rating: 6", "La réponse est C", "Die Antwort ist B", "La respuesta correcta es D",
   "答案是C", "正确答案：B", "答えはB". A final one ("final answer"), a JSON key, or a line that starts with
   "Answer:" is strong, and the last strong one counts; else the last of the others ("... the answer is D").
   Lenient reading also takes "I'd go with C", "I choose C", "classified as X", and for ratings "I'd give it 6".
   What follows the marker must be the answer itself: "the answer is not A" states nothing.
3. **Otherwise the last sentence.** Letters (or option texts, labels, numbers) that are ruled out ("not A",
   "A is wrong", "rule out A", "neither A nor B"), only weighed ("A or C?", "between B and D") or not letters at all
   (a letter inside a word, the article "A" before a lowercase word, the pronoun "I") do not count; of the rest, the
   last sentence naming any decides, and names several: ``ambiguous``.

Letters (:func:`parse_letter`):

* ``strict`` accepts only an unambiguous explicit letter: the whole answer is one letter ("B", "(b)", "**C**",
  "Answer: D", ``\\boxed{C}``, ``{"answer": "C"}``) in either case, or an explicit final-answer statement naming a
  letter ("... so the answer is C.", "La réponse est C"), or the none-of-them option's own text. "B. apple",
  "I think B", "I'd go with C", "B or C" are ``not_strict``.
* ``lenient`` (the default) also accepts, in this order after the whole-answer letter: the whole answer being one
  option's text ("apple"); a final-answer statement naming a letter or an option's text ("The answer is A cake");
  a leading letter label ("B. apple", "C, not A", unless the answer echoes the option list); none of them; then the
  last sentence's letters, then its option texts (whole words, an option inside a longer named one not counted).
  A lowercase letter counts only as the whole answer or right after a marker at the end of a statement ("answer:
  c"): "i think b" is no answer. A letter label that is not offered ("D. Rick" with A-C) is never taken: the
  answer is ``out_of_range`` unless an option's text decides. Known limit: "C. Rick" (a real letter with
  invented text) counts as C.
* None of them: when the last option is the none-of-them marker (or an option such as "None of the above"),
  "None of the above", "none of the options", "none-of-them"... choose it. Without such an option these answers
  are invalid (``none_of_them``), even if letters follow ("None of A, B or C fits").
* Refusals ("I cannot answer", "As an AI ...", "I'm sorry", "I don't know") are invalid (``refusal``) unless the
  answer also states an explicit answer ("I'm sorry, but the answer is B").

Yes/no (:func:`parse_yes_no`): case-insensitive whole words, so "Not", "None", "Nobody" hold no "no", and
"Incorrectly" is no answer word. A negator (not, never, n't, cannot) up to three words before an answer word in the
same clause flips it ("isn't acceptable" is negative, "not incorrect" positive). "no" before a noun is a determiner
("no issues, it is acceptable" is positive), unless the next word starts a clause ("No it isn't"). A hedge naming
both sides ("yes or no", "yes and no", "correct or incorrect") is ``ambiguous``. Order: the whole answer, a
final-answer statement, a hedge, the first word(s) (also oui/non, ja/nein, sí/no, 是/否, はい/いいえ), then all answer
words outside questions ("Correct or incorrect? I'd say incorrect."): if they disagree the negative wins (the
reference checks its negative words first), ``conflict="first"`` takes the first, ``conflict="invalid"`` refuses.
"Absolutely not" and "Not really" are negative.

Scale (:func:`parse_scale`): the scale itself is no rating ("on a scale of 0 to 10", "out of 10", "/10", "with 10
being fully logical"); "N/10" and "N out of 10" are, and so is a number alone on the first line; a hedge between two
ratings ("7 or 8", "between 7 and 8") is ``ambiguous``.

Labels (:func:`parse_label`): British and American spellings are the same word ("recognised"/"recognized",
"cancelled"/"canceled", "colour"/"color", "cheque"/"check"), case, spaces, hyphens and underscores equivalent; a
label alone on the first line is the answer, its explanation after it is not read.

The NewTerm reference rules are reproduced apart, in :func:`newterm_reference_letter` and
:func:`newterm_reference_yes_no`, for the ``newterm-reference`` scoring mode.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from runner.plan.choices import LETTERS, NONE_OF_THEM_MARKER

__all__ = [
    "YES_NO_FAMILIES",
    "Parsed",
    "Reason",
    "is_none_of_them",
    "is_refusal",
    "newterm_reference_letter",
    "newterm_reference_yes_no",
    "parse_answer",
    "parse_label",
    "parse_letter",
    "parse_letters",
    "parse_scale",
    "parse_yes_no",
]


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any
    reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.reason is None


class Reason:
    """The reason classes of an invalid :class:`Parsed` (plain strings, so results stay plain JSON)."""

    EMPTY = "empty"
    REFUSAL = "refusal"
    NOT_FOUND = "not_found"
    NOT_STRICT = "not_strict"
    AMBIGUOUS = "ambiguous"
    OUT_OF_RANGE = "out_of_range"
    NONE_OF_THEM = "none_of_them"
    CONFLICT = "conflict"


# -- the answer's text ----------------------------------------------------------------------------------------

_THINK_TAG = r"(?:think|thinking|reasoning)"
_THINK_BLOCK = re.compile(rf"<({_THINK_TAG})\s*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = re.compile(rf"</{_THINK_TAG}\s*>", re.IGNORECASE)
_THINK_OPEN = re.compile(rf"\s*<{_THINK_TAG}\s*>", re.IGNORECASE)
_FENCED = re.compile(r"```[\w-]*[ \t]*\n?(.*?)\n?```", re.DOTALL)
#: the fields of a JSON answer that hold the answer, in order of preference
_ANSWER_KEYS = ("final_answer", "answer", "choice", "option", "letter", "label", "intent", "category", "class",
                "rating", "score", "verdict", "judgment", "judgement", "prediction")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEX_WRAP = re.compile(r"\\(?:text|textbf|textit|texttt|textrm|mathrm|mathbf|mathit|mbox)\s*\{([^{}]*)\}")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_CJK_EDGE = re.compile(rf"(?<=[{_CJK}])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=[{_CJK}])")


def _strip_thinking(text: str) -> str:
    text = _THINK_BLOCK.sub(" ", text)
    closing = list(_THINK_CLOSE.finditer(text))
    if closing:  # the opening tag was part of the prompt (chat templates that open the thinking block)
        text = text[closing[-1].end() :]
    return "" if _THINK_OPEN.match(text) else text  # unclosed: the model never got to its answer


def _json_answer(text: str) -> str | None:
    body = text.strip()
    fenced = _FENCED.fullmatch(body)
    body = fenced.group(1).strip() if fenced else body
    if not body.startswith("{"):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    fields = {re.sub(r"[\W_]+", "_", str(key).lower()).strip("_"): item for key, item in value.items()}
    for key in _ANSWER_KEYS:
        item = fields.get(key)
        if isinstance(item, str):
            return item
        if isinstance(item, (bool, int, float)):
            return json.dumps(item)
        if isinstance(item, list) and item and all(isinstance(x, (str, int)) for x in item):
            return ", ".join(map(str, item))
    return None


def _boxed_answer(text: str) -> str | None:
    found = list(_BOXED.finditer(text))
    if not found:
        return None
    start = end = found[-1].end()
    depth = 1
    while end < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        end += 1
    inner, before = text[start : end - 1 if depth == 0 else end], None
    while inner != before:
        before, inner = inner, _TEX_WRAP.sub(r"\1", inner)
    return inner.replace("$", "").strip()


def _plain(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return _CJK_EDGE.sub(" ", text)


def _answer_text(text: str) -> str:
    """What a grader reads: the answer without thinking, a JSON answer's field or a boxed answer, normalised."""
    text = _strip_thinking(text)
    found = _json_answer(text)
    if found is None:
        found = _boxed_answer(text)
    return _plain(text if found is None else found)


# -- words ----------------------------------------------------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")
#: words (letters and digits), contractions kept whole so "I'm" is no letter "I"
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_BRITISH = {
    "cheque": "check", "cheques": "checks", "practise": "practice", "practised": "practiced", "licence": "license",
    "defence": "defense", "offence": "offense", "programme": "program", "programmes": "programs", "grey": "gray",
    "tyre": "tire", "tyres": "tires", "enrol": "enroll", "enrolment": "enrollment", "fulfil": "fulfill",
    "fulfilment": "fulfillment", "instalment": "installment", "instalments": "installments", "ageing": "aging",
    "judgement": "judgment", "aeroplane": "airplane", "jewellery": "jewelry", "centre": "center", "centres":
    "centers", "metre": "meter", "metres": "meters", "litre": "liter", "litres": "liters", "theatre": "theater",
    "fibre": "fiber", "catalogue": "catalog", "dialogue": "dialog", "analogue": "analog", "mould": "mold",
}
_BRITISH_RULES = (
    (re.compile(r"^(\w{2,})is(e|es|ed|ing|ation|ations|er|ers)$"), r"\1iz\2"),  # authorise, recognised
    (re.compile(r"^(\w+)ys(e|es|ed|ing)$"), r"\1yz\2"),  # analyse
    (re.compile(r"^(col|fav|behavi|hon|lab|neighb|flav|hum|harb|rum|sav|arm|vap|endeav|rig|od|val|cand|splend)our"),
     r"\1or"),  # colour, favourite
    (re.compile(r"^(cancel|label|travel|model|fuel|total|signal|counsel|level|channel|dial|equal|marvel|tunnel"
                r"|quarrel|rival|initial|jewel)l(ed|ing|er|ers)$"), r"\1\2"),  # cancelled, labelled
)


@functools.lru_cache(maxsize=65536)
def _spelling(word: str) -> str:
    """One spelling for British and American variants of a lowercase word (applied to both sides of a match)."""
    if word in _BRITISH:
        return _BRITISH[word]
    for pattern, replacement in _BRITISH_RULES:
        word = pattern.sub(replacement, word)
    return word


def _tokens(text: str) -> list[str]:
    return [_spelling(word) for word in _WORD.findall(_plain(text).lower())]


@functools.lru_cache(maxsize=4096)
def _name_tokens(name: str) -> tuple[str, ...]:
    """An option's or label's words (the same few names are looked for in every answer)."""
    return tuple(_tokens(name))


_ANSWER_PREFIX = re.compile(
    r"^(?:(?:the|my|your|final|correct|best)\s+)*(?:answer|choice|option|letter|réponse|antwort|respuesta)\b"
    r"\s*(?:is\b|would\s+be\b|est\b|ist\b|es\b|[:=\-])?\s*:?\s*",
    re.IGNORECASE,
)
_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _core(text: str) -> str:
    """The answer without decoration: whitespace, markdown, quotes, surrounding brackets, a trailing period, and a
    leading "Answer:" / "The answer is" / "Option"."""
    s = _plain(text).strip()
    for _ in range(8):
        before = s
        s = s.strip().strip("*`\"'#$").strip()
        s = _ANSWER_PREFIX.sub("", s, count=1) or s
        s = s.rstrip(".").strip()
        if len(s) >= 2 and _PAIRS.get(s[0]) == s[-1]:
            s = s[1:-1]
        elif s.endswith(")") and "(" not in s:
            s = s[:-1]
        if s == before:
            break
    return s


def _find(hay: list[str], needle: list[str]) -> list[tuple[int, int]]:
    n = len(needle)
    return [(i, i + n) for i in range(len(hay) - n + 1) if hay[i : i + n] == needle]


def _same_text(core: str, names: Sequence[str]) -> list[int]:
    words = tuple(_tokens(core))
    return [i for i, name in enumerate(names) if words and _name_tokens(name) == words]


# -- reading an answer: its words, sentences, final-answer markers and ruled-out names ----------------------------

_SENTENCE_BREAK = re.compile(r"[.!?;\n\u3002]")
_CLAUSE_BREAK = re.compile(r"[.!?;\n\u3002,:\u3001\u2013\u2014]")
_DECORATION = re.compile(r"[\s*_`\"'(\[{:=<#]*")


class _Reader:
    """An answer's words with their places, and the sentence and clause each belongs to."""

    __slots__ = ("clause", "lower", "question", "sentence", "spans", "starts", "text", "words")

    def __init__(self, text: str) -> None:
        self.text = text
        found = list(_WORD.finditer(text))
        self.spans = [m.span() for m in found]
        self.starts = [a for a, _ in self.spans]
        self.words = [m.group() for m in found]
        self.lower = [_spelling(w.lower()) for w in self.words]
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


#: words after which a capital "A" or "I" is the letter, not the article or the pronoun ("A is plausible")
_LETTER_NEXT = frozenset(
    "is are was were seems seem looks look appears appear fits fit matches match describes best could would might "
    "may must should can cannot also too and or nor vs versus because since as so then which that only alone here "
    "instead rather than if with without remains makes has does".split()
)
#: words after which "I" is the pronoun, not option I
_PRONOUN_NEXT = frozenset(
    "am think believe would will can cannot can't don't do guess choose chose pick select feel need have must "
    "should could might see know hope agree understand suggest recommend apologize apologise also".split()
)
_NAMING = frozenset({"option", "choice", "letter", "answer", "options", "choices"})


def _not_a_letter(r: _Reader, k: int) -> bool:
    """The article "A" before a lowercase word ("A careful reading") or the pronoun "I" ("I think")."""
    word = r.words[k]
    if word not in ("A", "I") or k + 1 == len(r.words) or r.text[r.spans[k][1] : r.starts[k + 1]].strip():
        return False
    following = r.words[k + 1]
    if word == "I" and following.lower() in _PRONOUN_NEXT:
        return True
    named = k > 0 and r.lower[k - 1] in _NAMING and not r.text[r.spans[k - 1][1] : r.starts[k]].strip()
    return following[:1].islower() and following.lower() not in _LETTER_NEXT and not named


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


def _walk(r: _Reader, k: int, step: int, stop: frozenset[str], skip: frozenset[str], names: set[int]) -> bool:
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


def _ruled_out(r: _Reader, first: int, last: int, names: set[int]) -> bool:
    return _walk(r, first, -1, _NEGATE_BEFORE | {"n't"}, _SKIP_BEFORE, names) or _walk(
        r, last, 1, _NEGATE_AFTER | {"n't"}, _SKIP_AFTER, names
    )


def _choose(r: _Reader, spots: list[tuple[int, int, int]]) -> Parsed | None:
    """``spots``: (first word, last word, value) of each name in order. Leaving out the names ruled out ("not A",
    "isn't A", "rule out A", "neither A nor B", "A is wrong", "A and B can be ruled out") and those only weighed (in
    a question, "A or C?"; "between B and D", "either A or C"), the value the last sentence naming any names;
    several there: ambiguous; only weighed ones: ambiguous."""
    names = {j for a, b, _ in spots for j in range(a, b + 1)}
    kept, weighed = [], False
    for a, b, value in spots:
        if _ruled_out(r, a, b, names):
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


def _mentions(r: _Reader, names: Sequence[str]) -> list[tuple[int, int, int]]:
    """(first word, last word, name index) of every whole-word mention of a name, in order, leaving out a mention
    inside the mention of a longer name ("apple" inside "apple pie")."""
    starts: dict[str, list[int]] = {}
    for k, word in enumerate(r.lower):
        starts.setdefault(word, []).append(k)
    spans = []
    for i, name in enumerate(names):
        needle = _name_tokens(name)
        for a in starts.get(needle[0], []) if needle else []:
            if tuple(r.lower[a : a + len(needle)]) == needle:
                spans.append((a, a + len(needle) - 1, i))
    spans = [s for s in spans if not any(o[1] - o[0] > s[1] - s[0] and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    return sorted(spans)


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
_CHOSEN = re.compile(
    r"(?:\b(?:i|we)(?:'d|'ll|'m|\s+would|\s+will|\s+am|\s+will\s+go)?\s+(?:say|pick|choose|select))\b"
    r"|\b(?:go(?:ing)?\s+with|went\s+with|opt(?:ing)?\s+for|settle\s+on|vote\s+for|choose|chose|pick|select)\b"
    r"|\b(?:classified\s+as|categori[sz]ed\s+as|falls?\s+(?:under|into)|belongs?\s+to)\b"
    r"|我选|选择|應選|应选",
    re.IGNORECASE,
)
#: ratings given: "I'd give it 6", "rate it a 7", "gets a 3", "deserves a 9"
_RATED = re.compile(
    r"\b(?:give|gives|giving|gave|rate|rates|rated|score|scores|scored|gets|get|got|deserves|deserve|assign|assigns"
    r"|award|awards)\b(?:\s+(?:it|this|that|this\s+sentence|the\s+sentence|this\s+one))?(?:\s+(?:a|an|as|at))?",
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


def _stated(text: str, read_at: Callable[[int], Parsed | None], also: re.Pattern[str] | None = None) -> Parsed | None:
    """The answer an explicit final-answer statement gives: after the last strong marker that is followed by an
    answer, else after the last other one."""
    marks = _markers(text, also)
    for strong in (True, False):
        for is_strong, end in reversed(marks):
            if is_strong == strong and (got := read_at(end)) is not None:
                return got
    return None


# -- refusals and none-of-them --------------------------------------------------------------------------------

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
    return bool(_REFUSAL.search(_plain(text)))


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
    words = " ".join(_tokens(text))
    if not words:
        return False
    if words in _NONE_ALONE or " ".join(_tokens(_core(text))) in _NONE_ALONE:
        return True
    spots = [m.end() for m in _NONE.finditer(words)]
    mark = " ".join(_tokens(marker))
    if mark:
        spots += [m.end() for m in re.finditer(rf"(?<!\S){re.escape(mark)}(?!\S)", words)]
    return any(not _EXCEPT.match(words[end:]) for end in spots)


def _marker_slot(options: Sequence[str], marker: str) -> int | None:
    if options and (_tokens(options[-1]) == _tokens(marker) or is_none_of_them(options[-1], marker)):
        return len(options) - 1
    return None


# -- single letter ---------------------------------------------------------------------------------------------

_LEADING = re.compile(
    r"^[\s*_`\"'(\[#]*(?i:(?:(?:the|my|final|correct)\s+)*(?:answer|option|choice)\s*(?:is|:)?\s*:?\s*)?"
    r"[*(\[]*([^\W_])(?![^\W_])[*)\]]*\s*(?:[.:),;\-]|$|\n)"
)
_OPTION_LINE = re.compile(r"^[\s*#>\-]*[(\[]?([A-Z])[.)\]:]\s+\S", re.MULTILINE)
_LEAD_IN = frozenset("option choice letter the la le die el opción opzione".split())
_ARTICLES = frozenset({"a", "an", "the"})


def _lone_letter(core: str, valid: str) -> int | None:
    if len(core) != 1:
        return None
    for candidate in (core, core.upper(), core.lower()):
        if candidate in valid:
            return valid.index(candidate)
    return None


def _looks_like_letter(char: str) -> bool:
    return len(char) == 1 and (char.isdigit() or "A" <= char <= "Z")


def _letter_reader(r: _Reader, valid: str, options: Sequence[str] | None) -> Callable[[int], Parsed | None]:
    """Reads the letter (or, given ``options``, the option text) right after a marker: "is C", ": (c).", "is A
    cake" (option text), "is option D"; "is A or C" is ambiguous, "is not A" nothing."""
    mentions = _mentions(r, options) if options else []

    def read_at(offset: int) -> Parsed | None:
        k = r.at(offset, _LEAD_IN)
        if k is None:
            return None
        for j in (k, k + 1 if r.lower[k] in _ARTICLES else k):
            named = [i for a, _, i in mentions if a == j]
            if named:
                return Parsed(named[0])
        word = r.words[k]
        if len(word) != 1 or _not_a_letter(r, k):
            return None
        if word.islower() and not r.ends_statement(k):
            return None  # "the answer is a bit unclear"
        index = _lone_letter(word, valid) if word.islower() else (valid.index(word) if word in valid else None)
        if index is None:
            return Parsed(None, Reason.OUT_OF_RANGE) if _looks_like_letter(word) else None
        after = k + 1
        if after + 1 < len(r.words) and r.lower[after] == "or" and r.words[after + 1] in valid:
            return Parsed(None, Reason.AMBIGUOUS)
        return Parsed(index)

    return read_at


def parse_letter(
    text: str,
    options: Sequence[str],
    letters: str = LETTERS,
    *,
    mode: Literal["lenient", "strict"] = "lenient",
    marker: str = NONE_OF_THEM_MARKER,
) -> Parsed:
    """The chosen option's shown position (0 = the first letter). ``strict`` and ``lenient``: module docstring."""
    valid = letters[: len(options)]
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    answer = _answer_text(text)
    if not answer.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(answer)
    lone = _lone_letter(core, valid)
    if lone is not None:
        return Parsed(lone)
    slot = _marker_slot(options, marker)
    out_of_range = _looks_like_letter(core)
    r = _Reader(answer)
    if mode == "strict":
        stated = _stated(answer, _letter_reader(r, valid, None))
        if stated is not None and (stated.valid or stated.reason == Reason.OUT_OF_RANGE):
            return stated
        if slot is not None and _tokens(core) in (_tokens(marker), _tokens(options[slot])):
            return Parsed(slot)
        if is_refusal(answer):
            return Parsed(None, Reason.REFUSAL)
        return Parsed(None, Reason.OUT_OF_RANGE if out_of_range else Reason.NOT_STRICT)
    same = _same_text(core, options)
    if len(same) == 1:
        return Parsed(same[0])
    stated = _stated(answer, _letter_reader(r, valid, options), _CHOSEN)
    if stated is not None:
        return stated
    leading = _LEADING.match(answer)
    if leading and len(set(_OPTION_LINE.findall(answer))) < 2:  # a leading label, unless the options are echoed
        if leading.group(1) in valid:
            return Parsed(valid.index(leading.group(1)))
        out_of_range = out_of_range or _looks_like_letter(leading.group(1))
    if is_none_of_them(answer, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    spots = [
        (k, k, valid.index(w)) for k, w in enumerate(r.words) if len(w) == 1 and w in valid and not _not_a_letter(r, k)
    ]
    found = _choose(r, spots) or _choose(r, _mentions(r, options))
    if found is not None:
        return found
    return Parsed(None, Reason.OUT_OF_RANGE if out_of_range else Reason.NOT_FOUND)


# -- a set of letters ------------------------------------------------------------------------------------------

_LIST_FILLER = frozenset({"and", "or", "option", "options", "letter", "letters", "choice", "choices", "both"})
_LIST_PUNCT = re.compile(r"^[\s,;/&+().\[\]*:\-]*$")


def parse_letters(
    text: str, options: Sequence[str], letters: str = LETTERS, *, marker: str = NONE_OF_THEM_MARKER
) -> Parsed:
    """A set of letters ("A, C", "A and C", "A C", "(B), (D)", "Answer: A, C") -> sorted tuple of shown positions.

    A whole answer made of letters and separators may use either case; a letter there that is not offered makes
    the answer ``out_of_range``. Otherwise every standalone offered capital letter counts, except an article "A"
    before a lowercase word, the pronoun "I" and a letter ruled out ("A and C, not B"). No letter (or "None") is
    invalid. Thinking, JSON and ``\\boxed{}`` are read as for single letters."""
    valid = letters[: len(options)]
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    answer = _answer_text(text)
    if not answer.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(answer)
    words = _WORD.findall(core)
    if (
        words
        and _LIST_PUNCT.match(_WORD.sub(" ", core))
        and all(len(w) == 1 or w.lower() in _LIST_FILLER for w in words)
    ):
        picked = [w for w in words if len(w) == 1]
        if picked:
            chosen = {_lone_letter(w, valid) for w in picked}
            if None in chosen:
                return Parsed(None, Reason.OUT_OF_RANGE)
            return Parsed(tuple(sorted(i for i in chosen if i is not None)))
    slot = _marker_slot(options, marker)
    if is_none_of_them(answer, marker):
        return Parsed((slot,)) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(answer) and not _stated(answer, lambda end: Parsed(end)):
        return Parsed(None, Reason.REFUSAL)
    r = _Reader(answer)
    named = {k for k, word in enumerate(r.words) if len(word) == 1 and word in valid}
    chosen_set = {
        valid.index(r.words[k]) for k in named if not _not_a_letter(r, k) and not _ruled_out(r, k, k, named)
    }
    if chosen_set:
        return Parsed(tuple(sorted(chosen_set)))
    return Parsed(None, Reason.NOT_FOUND)


# -- yes / no --------------------------------------------------------------------------------------------------

#: answer-word families: name -> (positive word, negative word)
YES_NO_FAMILIES: dict[str, tuple[str, str]] = {
    "yes/no": ("yes", "no"),
    "correct/incorrect": ("correct", "incorrect"),
    "acceptable/unacceptable": ("acceptable", "unacceptable"),
    "true/false": ("true", "false"),
}
#: the same answers in other languages, read only as the whole answer, its first word or after "Answer:"
_FOREIGN: dict[str, dict[str, bool]] = {
    "yes/no": {"oui": True, "ja": True, "sí": True, "si": True, "是": True, "是的": True, "对": True, "はい": True,
               "non": False, "nein": False, "否": False, "不是": False, "不对": False, "いいえ": False},
    "correct/incorrect": {"correcte": True, "correcta": True, "correcto": True, "richtig": True, "正确": True,
                          "incorrecte": False, "incorrecta": False, "incorrecto": False, "falsch": False,
                          "错误": False, "不正确": False},
}
_NEGATORS = frozenset({"not", "never", "hardly", "cannot", "nor"})
_YES_NO_CLAUSE = re.compile(r"[.,;:!?\n]")
#: words after which a leading "no" is the answer, not a determiner ("No it isn't" but "No issues")
_NO_ANSWERS = frozenset(
    "it it's its this that these those the a an i i'm i'd there there's they he she we you not because since but as "
    "so definitely absolutely certainly never way sir way".split()
)
#: a negation standing for the negative answer: "Absolutely not.", "Not at all", "Not really"
_BARE_NOT = re.compile(
    r"(?:(?:absolutely|definitely|certainly|of\s+course|surely|clearly)\s+)?not(?:\s+(?:really|at\s+all|quite))?!?",
    re.IGNORECASE,
)
_ASKED = re.compile(r"[^.!\n?]*\?")  # the rest of the sentence is a question ("Correct or incorrect? ...")
_HEDGE_GAP = re.compile(r"\s*(?:/|,?\s*(?:or|and|nor|oder|und|ou|et|o|y|maybe|perhaps)\b)\s*", re.IGNORECASE)


def _family_words(family: str | tuple[str, str] | None, foreign: bool = False) -> dict[str, bool]:
    if family is None:
        keys = list(YES_NO_FAMILIES)
        pairs = list(YES_NO_FAMILIES.values())
    elif isinstance(family, tuple):
        keys, pairs = [], [family]
    else:
        key = family.lower().replace(" ", "")
        if key not in YES_NO_FAMILIES:
            raise ValueError(f"unknown yes/no family {family!r}; use one of {', '.join(YES_NO_FAMILIES)}")
        keys, pairs = [key], [YES_NO_FAMILIES[key]]
    words: dict[str, bool] = {}
    for key in keys if foreign else ():
        words.update(_FOREIGN.get(key, {}))
    for positive, negative in pairs:
        words[positive.lower()] = True
        words[negative.lower()] = False
    return words


def _is_negator(word: str) -> bool:
    return word in _NEGATORS or word.endswith("n't")


def _polarities(text: str, words: dict[str, bool]) -> list[tuple[bool, int, int, int]]:
    """(polarity, start, end, word index) of every answer word in order, negation applied."""
    matches = list(_WORD.finditer(text))
    lowered = [m.group().lower() for m in matches]
    out = []
    for k, word in enumerate(lowered):
        if word not in words:
            continue
        if "-" in (text[matches[k].end() : matches[k].end() + 1], text[matches[k].start() - 1 : matches[k].start()]):
            continue  # part of a compound: "non-standard", "no-brainer"
        if _ASKED.match(text, matches[k].end()):
            continue  # asked, not answered: "Correct or incorrect? ..."
        if word == "no" and k + 1 < len(matches) and not text[matches[k].end() : matches[k + 1].start()].strip() \
                and lowered[k + 1] not in _NO_ANSWERS:
            continue  # "there is no error", "no issues, it is acceptable": a determiner, not an answer
        polarity = words[word]
        for j in range(k - 1, max(k - 4, -1), -1):
            if _YES_NO_CLAUSE.search(text[matches[j].end() : matches[j + 1].start()]):
                break
            if _is_negator(lowered[j]):
                polarity = not polarity
                break
        out.append((polarity, matches[k].start(), matches[k].end(), k))
    return out


def _hedged(text: str, found: list[tuple[bool, int, int, int]]) -> bool:
    """Both sides named as alternatives: "yes or no", "yes and no", "correct/incorrect", "neither yes nor no"."""
    return any(
        a[0] != b[0] and _HEDGE_GAP.fullmatch(text[a[2] : b[1]]) for a, b in zip(found, found[1:], strict=False)
    )


def _leading_polarity(text: str, words: dict[str, bool]) -> bool | None:
    found = _polarities(text, words)
    if not found:
        return None
    polarity, _, _, k = found[0]
    first = _WORD.findall(text)[:1]
    return polarity if k == 0 or (k == 1 and _is_negator(first[0].lower())) else None


def parse_yes_no(
    text: str,
    family: str | tuple[str, str] | None = None,
    *,
    conflict: Literal["negative", "first", "invalid"] = "negative",
) -> Parsed:
    """``True`` for the positive word (YES, Correct, Acceptable, True), ``False`` for the negative one.

    ``family`` is a key of :data:`YES_NO_FAMILIES` (e.g. ``"correct/incorrect"``), a ``(positive, negative)`` pair,
    or ``None`` for every family's words; pass the family the prompt asked for, so that a stray "no" or "true"
    in an explanation is not read as the answer. Rules (module docstring): whole words, negation flips, the whole
    answer / a final-answer statement / a hedge / the first word first, then all answer words, the negative
    winning a conflict unless ``conflict`` says otherwise."""
    words = _family_words(family)
    leading_words = _family_words(family, foreign=True)
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    answer = _answer_text(text)
    if not answer.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(answer)
    core_tokens = _WORD.findall(core.lower())
    if len(core_tokens) == 1 and core_tokens[0] in leading_words:
        return Parsed(leading_words[core_tokens[0]])

    def read_at(offset: int) -> Parsed | None:
        rest = _core(answer[offset:])
        if _hedged(rest, _polarities(rest, leading_words)[:2]):
            return Parsed(None, Reason.AMBIGUOUS)
        polarity = _leading_polarity(rest, leading_words)
        return None if polarity is None else Parsed(polarity)

    stated = _stated(answer, read_at)
    if stated is not None:
        return stated
    found = _polarities(answer, words)
    if _hedged(answer, found):
        return Parsed(None, Reason.AMBIGUOUS)
    leading = _leading_polarity(core, leading_words)
    if leading is not None:
        return Parsed(leading)
    if _BARE_NOT.fullmatch(core):
        return Parsed(False)
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    if not found:
        return Parsed(None, Reason.NOT_FOUND)
    polarities = [polarity for polarity, *_ in found]
    if len(set(polarities)) == 1 or conflict == "first":
        return Parsed(polarities[0])
    if conflict == "invalid":
        return Parsed(None, Reason.CONFLICT)
    return Parsed(False)


# -- integer scale ---------------------------------------------------------------------------------------------

_INTEGER = re.compile(r"(?<![\w.\-])(-?\d+)(?!\w|[.,]\d)")
_NUMBER_WORDS = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_DENOMINATOR = re.compile(r"(?:out\s+of|/)\s*$", re.IGNORECASE)
_RATING_AT = re.compile(r"[\s*_`\"'(\[{:=]*(?:(?:a|an|of)\s+)?(?:(-?\d+)(?!\w|[.,]\d)|([a-z]+)\b)", re.IGNORECASE)


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
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    answer = _answer_text(text)
    if not answer.strip():
        return Parsed(None, Reason.EMPTY)

    def rated(n: int) -> Parsed:
        return Parsed(n) if low <= n <= high else Parsed(None, Reason.OUT_OF_RANGE)

    core, first_line = _core(answer), _core(answer.strip().splitlines()[0])
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

    stated = _stated(plain, read_at, _RATED)
    if stated is not None:
        return stated
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    r = _Reader(plain)
    integers = [
        (bisect.bisect_left(r.starts, m.start()), int(m.group(1)))
        for m in _INTEGER.finditer(plain)
        if not _DENOMINATOR.search(plain[max(0, m.start() - 12) : m.start()])
    ]
    found = _choose(r, [(k, k, n) for k, n in integers if low <= n <= high])
    if found is not None:
        return found
    if integers:
        return Parsed(None, Reason.OUT_OF_RANGE)
    for word in _tokens(plain):
        if word in _NUMBER_WORDS:
            return rated(_NUMBER_WORDS[word])
    return Parsed(None, Reason.NOT_FOUND)


# -- label names -----------------------------------------------------------------------------------------------

_LABEL_LEAD_IN = frozenset("the a an intent label class category option answer is".split())


def parse_label(text: str, labels: Sequence[str], *, marker: str = NONE_OF_THEM_MARKER) -> Parsed:
    """The index in ``labels`` of the label named (Bank-77 intents such as "lost_or_stolen_card").

    The whole answer (decoration and "Answer:" stripped) equal to one label, first exactly, then normalised
    (case-insensitive; spaces, hyphens, underscores and other punctuation equivalent; British and American
    spellings alike: "Lost or stolen card", "card payment not recognized" for "card_payment_not_recognised");
    else the label a final-answer statement names ("It's not card_linking; the intent is card_arrival"); else the
    one label the last sentence naming any names, leaving out labels ruled out ("not card_linking") and a label
    inside a longer named one ("exchange_rate" in "card_payment_wrong_exchange_rate"). A none-of-them answer picks
    the marker if it is the last label."""
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    answer = _answer_text(text)
    if not answer.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(answer)
    exact = [i for i, label in enumerate(labels) if label in (core, answer.strip())]
    if len(exact) == 1:
        return Parsed(exact[0])
    same = _same_text(core, labels)
    if len(same) == 1:
        return Parsed(same[0])
    if len(same) > 1:
        return Parsed(None, Reason.AMBIGUOUS)
    r = _Reader(answer)
    mentions = _mentions(r, labels)

    def read_at(offset: int) -> Parsed | None:
        k = r.at(offset, _LABEL_LEAD_IN)
        named = {i for a, _, i in mentions if a == k}
        return Parsed(named.pop()) if len(named) == 1 else None

    stated = _stated(answer, read_at, _CHOSEN)
    if stated is not None:
        return stated
    first_line = _same_text(_core(answer.strip().splitlines()[0]), labels)
    if len(first_line) == 1:  # the label, then its explanation
        return Parsed(first_line[0])
    slot = _marker_slot(labels, marker)
    if is_none_of_them(answer, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    found = _choose(r, mentions)
    if found is not None:
        return found
    return Parsed(None, Reason.NOT_FOUND)


# -- the NewTerm reference -------------------------------------------------------------------------------------

_REFERENCE_LETTERS = ("A", "B", "C", "D")


def newterm_reference_letter(text: str, options: Sequence[str]) -> Parsed:
    """COMA/COST as the released NewTerm evaluation code reads an answer: every run of non-word characters and
    ``_`` becomes a space; the first token that is exactly A, B, C or D (case-sensitive, so an article "A"
    counts) is the answer, right or wrong; with no such token, the option whose text appears in the answer
    (case-insensitive substring) counts when it is the only one that does. A letter beyond the options is
    ``out_of_range`` (the reference scores it wrong).

    Not reproduced: the reference keeps its loop variable across lines, so an answer with no token at all
    inherits the previous answer's letter; here an empty answer is invalid (``empty``)."""
    for token in _NON_WORD.sub(" ", text).split():
        if token in _REFERENCE_LETTERS:
            index = _REFERENCE_LETTERS.index(token)
            return Parsed(index) if index < len(options) else Parsed(None, Reason.OUT_OF_RANGE)
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    lowered = text.lower()
    found = [i for i, option in enumerate(options) if option.lower() in lowered]
    if len(found) == 1:
        return Parsed(found[0])
    return Parsed(None, Reason.AMBIGUOUS if found else Reason.NOT_FOUND)


_REFERENCE_NEGATIVE = ("NO", "No", "Incorrect", "Unacceptable")
_REFERENCE_POSITIVE = ("YES", "Yes", "Correct", "Acceptable")


def newterm_reference_yes_no(text: str) -> Parsed:
    """CSJ as the released NewTerm code reads it: any of NO, No, Incorrect, Unacceptable as a case-sensitive
    substring -> ``False``; else any of YES, Yes, Correct, Acceptable -> ``True``; else invalid (scored wrong).
    Substrings, as the reference does: "No" inside "Not", "None", "Nobody" or "Notably" makes the answer
    negative, "not correct" (lowercase) positive, and "yes"/"correct" in lowercase are not found."""
    if any(word in text for word in _REFERENCE_NEGATIVE):
        return Parsed(False)
    if any(word in text for word in _REFERENCE_POSITIVE):
        return Parsed(True)
    return Parsed(None, Reason.EMPTY if not text.strip() else Reason.NOT_FOUND)


# -- one entry point for the engine ----------------------------------------------------------------------------

ParseKind = Literal["letter", "letters", "yes_no", "scale", "label", "none_of_them"]


def parse_answer(
    text: str,
    kind: ParseKind,
    *,
    options: Sequence[str] = (),
    letters: str = LETTERS,
    mode: Literal["lenient", "strict"] = "lenient",
    family: str | tuple[str, str] | None = None,
    low: int = 0,
    high: int = 10,
    marker: str = NONE_OF_THEM_MARKER,
    scoring: Literal["default", "newterm-reference"] = "default",
) -> Parsed:
    """Dispatch to one parser by name, for a stage's ``parse:`` setting. ``scoring="newterm-reference"`` reads
    letters and yes/no with the reference's rules instead. ``none_of_them`` gives ``True`` when the answer says
    none fits (Know-No's hint in the instruction) and ``False`` otherwise (refusals and empty answers invalid;
    thinking is not read)."""
    if kind == "letter":
        if scoring == "newterm-reference":
            return newterm_reference_letter(text, options)
        return parse_letter(text, options, letters, mode=mode, marker=marker)
    if kind == "yes_no":
        return newterm_reference_yes_no(text) if scoring == "newterm-reference" else parse_yes_no(text, family)
    if kind == "letters":
        return parse_letters(text, options, letters, marker=marker)
    if kind == "scale":
        return parse_scale(text, low, high)
    if kind == "label":
        return parse_label(text, options, marker=marker)
    if kind == "none_of_them":
        if not text.strip():
            return Parsed(None, Reason.EMPTY)
        answer = _answer_text(text)
        if is_none_of_them(answer, marker):
            return Parsed(True)
        return Parsed(None, Reason.REFUSAL) if is_refusal(answer) else Parsed(False)
    raise ValueError(f"unknown parser {kind!r}")

