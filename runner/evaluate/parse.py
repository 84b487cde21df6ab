"""Answer parsers. Each returns a :class:`Parsed`: a value, or ``None`` with the reason class it is invalid.

Reason classes (:class:`Reason`): ``empty``, ``refusal``, ``not_found`` (nothing recognisable), ``not_strict``
(strict mode: not exactly one letter), ``ambiguous`` (several option texts or labels match), ``out_of_range``
(a letter or number outside the offered ones, e.g. "D. Rick" with options A-C), ``none_of_them`` (the answer says
no option fits, but no none-of-them option was offered), ``conflict`` (yes and no, with ``conflict="invalid"``).
Invalid answers are scored wrong.

Decisions, in one place:

* Letters (:func:`parse_letter`, lenient, the default) follow the NewTerm reference for capital letters: the first
  standalone letter among the offered ones counts, so an article "A" does ("A good choice is B" -> A). Ahead of
  that scan come the unambiguous forms: the whole answer is one letter ("B", "(B)", "B.", "Answer: C",
  "The answer is (B)."), the whole answer is one option's text, the answer starts with a letter label ("B. apple",
  "C, not A"), or says "the answer is X"/"Answer: X" later on (this beats an earlier stray capital, where the
  reference would take the capital). A lowercase letter counts only when it is the whole answer ("b", "b)",
  "answer: c"); "i think b" is not a letter answer. The pronoun "I" ("I think ...") is skipped when nine or more
  options make "I" a letter. Finally the text of exactly one option (whole words, case-insensitive; an option
  whose every mention lies inside a longer matching option's mention does not count). A letter label that is
  not offered ("D. Rick" with A-C) is never taken: the answer is ``out_of_range`` unless an option's text decides.
  Known limit: "C. Rick" (a real letter with invented text) counts as C. ``strict`` takes only the whole-answer
  letter (either case) or the none-of-them option's own text; "B. apple" is ``not_strict``.
* None of them: when the last option is the none-of-them marker (or an option such as "None of the above"),
  "None of the above", "none of the options", "none-of-them"... choose it. Without such an option these
  answers are invalid (``none_of_them``), even if letters follow ("None of A, B or C fits").
* Refusals ("I cannot answer", "As an AI ...", "I'm sorry", "I don't know") are invalid (``refusal``) unless the
  answer also states an explicit answer (a whole-answer letter, a leading label, "the answer is X").
* Yes/no (:func:`parse_yes_no`): case-insensitive whole words, so "Not", "None", "Notably", "Nobody" hold no
  "no", and "Incorrectly"/"correctly" are not answer words. A negator (not, never, n't, cannot) up to three
  words before an answer word in the same clause flips it: "not correct", "isn't acceptable" are negative,
  "not incorrect" positive. A "no" followed by a word is a determiner ("there is no error", "correct, no
  issues"), not an answer, unless it is the answer's first word ("No it isn't"). The whole answer, its first word, or
  the word after "the answer is" decides first; otherwise all answer words are read and, if they disagree, the
  negative wins (the reference checks its negative words first); ``conflict="first"`` takes the first one instead,
  ``conflict="invalid"`` refuses.
* The NewTerm reference rules are reproduced apart, in :func:`newterm_reference_letter` and
  :func:`newterm_reference_yes_no`, for the ``newterm-reference`` scoring mode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


# -- text helpers ---------------------------------------------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")
#: words (letters and digits), contractions kept whole so "I'm" is no letter "I"
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_ANSWER_PREFIX = re.compile(
    r"^(?:(?:the|my|your|final|correct|best)\s+)*(?:answer|choice|option|letter)\b\s*(?:is\b|would\s+be\b|[:=\-])?"
    r"\s*:?\s*",
    re.IGNORECASE,
)
_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_ANSWER_MARKER = re.compile(r"\banswer\s*(?:is|would\s+be|:)\s*:?\s*", re.IGNORECASE)


def _plain(text: str) -> str:
    return text.replace("\u2019", "'").replace("\u2018", "'")


def _tokens(text: str) -> list[str]:
    return _WORD.findall(_plain(text).lower())


def _core(text: str) -> str:
    """The answer without decoration: whitespace, markdown, quotes, surrounding brackets, a trailing period, and a
    leading "Answer:" / "The answer is" / "Option"."""
    s = _plain(text).strip()
    for _ in range(8):
        before = s
        s = s.strip().strip("*`\"'").strip()
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


def _mentioned(text: str, names: Sequence[str]) -> list[int]:
    """Indices of the names mentioned in ``text`` as whole words (case-insensitive), leaving out a name whose
    every mention lies inside the mention of a longer name ("apple" inside "apple pie")."""
    hay = _tokens(text)
    needles = [_tokens(name) for name in names]
    spans = {i: found for i, needle in enumerate(needles) if needle and (found := _find(hay, needle))}

    def covered(i: int) -> bool:
        return all(
            any(len(needles[j]) > len(needles[i]) and a2 <= a and b <= b2 for j in spans for a2, b2 in spans[j])
            for a, b in spans[i]
        )

    return [i for i in spans if not covered(i)]


def _same_text(core: str, names: Sequence[str]) -> list[int]:
    words = _tokens(core)
    return [i for i, name in enumerate(names) if words and _tokens(name) == words]


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
    r"^[\s*_`\"'(\[]*(?i:(?:(?:the|my|final|correct)\s+)*(?:answer|option|choice)\s*(?:is|:)?\s*:?\s*)?"
    r"[*(\[]*([^\W_])(?![^\W_])[*)\]]*\s*(?:[.:),;\-]|$|\n)"
)
_MARKED_LETTER = re.compile(r"^[*(\[\"']*([^\W_])(?![^\W_])")
#: words after which "I" is the pronoun, not option I
_PRONOUN_NEXT = frozenset(
    "am think believe would will can cannot can't don't do guess choose chose pick select feel need have must "
    "should could might see know hope agree understand suggest recommend apologize apologise".split()
)


def _lone_letter(core: str, valid: str) -> int | None:
    if len(core) != 1:
        return None
    for candidate in (core, core.upper(), core.lower()):
        if candidate in valid:
            return valid.index(candidate)
    return None


def _looks_like_letter(char: str) -> bool:
    return len(char) == 1 and (char.isdigit() or "A" <= char <= "Z")


def parse_letter(
    text: str,
    options: Sequence[str],
    letters: str = LETTERS,
    *,
    mode: Literal["lenient", "strict"] = "lenient",
    marker: str = NONE_OF_THEM_MARKER,
) -> Parsed:
    """The chosen option's shown position (0 = the first letter).

    ``strict``: the answer, stripped of whitespace, markdown, quotes, surrounding brackets, a trailing period and a
    leading "Answer:"/"The answer is", is exactly one offered letter (either case), or the none-of-them option's
    text. ``lenient`` (default): see the module docstring for the order of the rules."""
    valid = letters[: len(options)]
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(text)
    lone = _lone_letter(core, valid)
    if lone is not None:
        return Parsed(lone)
    slot = _marker_slot(options, marker)
    out_of_range = _looks_like_letter(core)
    if mode == "strict":
        if slot is not None and _tokens(core) in (_tokens(marker), _tokens(options[slot])):
            return Parsed(slot)
        if is_refusal(text):
            return Parsed(None, Reason.REFUSAL)
        return Parsed(None, Reason.OUT_OF_RANGE if out_of_range else Reason.NOT_STRICT)
    same = _same_text(core, options)
    if len(same) == 1:
        return Parsed(same[0])
    plain = _plain(text)
    leading = _LEADING.match(plain)
    if leading:
        if leading.group(1) in valid:
            return Parsed(valid.index(leading.group(1)))
        out_of_range = out_of_range or _looks_like_letter(leading.group(1))
    for marked in _ANSWER_MARKER.finditer(plain):
        letter = _MARKED_LETTER.match(plain[marked.end() :])
        if letter and letter.group(1) in valid:
            return Parsed(valid.index(letter.group(1)))
    if is_none_of_them(text, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(text):
        return Parsed(None, Reason.REFUSAL)
    words = _WORD.findall(plain)
    for k, token in enumerate(words):
        if len(token) == 1 and token in valid:
            if token == "I" and k + 1 < len(words) and words[k + 1].lower() in _PRONOUN_NEXT:
                continue
            return Parsed(valid.index(token))
    found = _mentioned(text, options)
    if len(found) == 1:
        return Parsed(found[0])
    if found:
        return Parsed(None, Reason.AMBIGUOUS)
    return Parsed(None, Reason.OUT_OF_RANGE if out_of_range else Reason.NOT_FOUND)


# -- a set of letters ------------------------------------------------------------------------------------------

_LIST_FILLER = frozenset({"and", "or", "option", "options", "letter", "letters", "choice", "choices", "both"})
#: words after which a capital "A" is the letter, not the article ("A is plausible")
_LETTER_VERBS = frozenset("is are was seems looks could would might may fits also too".split())
_LIST_PUNCT = re.compile(r"^[\s,;/&+().\[\]*:\-]*$")


def parse_letters(
    text: str, options: Sequence[str], letters: str = LETTERS, *, marker: str = NONE_OF_THEM_MARKER
) -> Parsed:
    """A set of letters ("A, C", "A and C", "A C", "(B), (D)", "Answer: A, C") -> sorted tuple of shown positions.

    A whole answer made of letters and separators may use either case; a letter there that is not offered makes
    the answer ``out_of_range``. Otherwise every standalone offered capital letter counts, except an article "A"
    before a lowercase word and the pronoun "I". No letter (or "None") is invalid."""
    valid = letters[: len(options)]
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(text)
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
    if is_none_of_them(text, marker):
        return Parsed((slot,)) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(text) and not _ANSWER_MARKER.search(text):
        return Parsed(None, Reason.REFUSAL)
    plain = _plain(text)
    matches = list(_WORD.finditer(plain))
    chosen_set: set[int] = set()
    for k, match in enumerate(matches):
        token = match.group()
        if len(token) != 1 or token not in valid:
            continue
        following = matches[k + 1].group() if k + 1 < len(matches) else ""
        spaced = k + 1 < len(matches) and not plain[match.end() : matches[k + 1].start()].strip()
        if token == "A" and spaced and following[:1].islower() and following not in _LIST_FILLER | _LETTER_VERBS:
            continue  # the article
        if token == "I" and following.lower() in _PRONOUN_NEXT:
            continue
        chosen_set.add(valid.index(token))
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
_NEGATORS = frozenset({"not", "never", "hardly", "cannot", "nor"})
_CLAUSE_BREAK = re.compile(r"[.,;:!?\n]")


def _family_words(family: str | tuple[str, str] | None) -> dict[str, bool]:
    if family is None:
        pairs = list(YES_NO_FAMILIES.values())
    elif isinstance(family, tuple):
        pairs = [family]
    else:
        key = family.lower().replace(" ", "")
        if key not in YES_NO_FAMILIES:
            raise ValueError(f"unknown yes/no family {family!r}; use one of {', '.join(YES_NO_FAMILIES)}")
        pairs = [YES_NO_FAMILIES[key]]
    words: dict[str, bool] = {}
    for positive, negative in pairs:
        words[positive.lower()] = True
        words[negative.lower()] = False
    return words


def _is_negator(word: str) -> bool:
    return word in _NEGATORS or word.endswith("n't")


def _polarities(text: str, words: dict[str, bool]) -> list[bool]:
    """Every answer word's polarity in order, negation applied."""
    matches = list(_WORD.finditer(_plain(text)))
    lowered = [m.group().lower() for m in matches]
    out: list[bool] = []
    for k, word in enumerate(lowered):
        if word not in words:
            continue
        if word == "no" and k > 0 and re.match(r"\s+[^\W\d_]", text[matches[k].end() :]):
            continue  # "there is no error", "correct, no issues": a determiner, not an answer
        polarity = words[word]
        for j in range(k - 1, max(k - 4, -1), -1):
            if _CLAUSE_BREAK.search(text[matches[j].end() : matches[j + 1].start()]):
                break
            if _is_negator(lowered[j]):
                polarity = not polarity
                break
        out.append(polarity)
    return out


def _leading_polarity(text: str, words: dict[str, bool]) -> bool | None:
    tokens = _tokens(text)
    if tokens and tokens[0] in words:
        return words[tokens[0]]
    if len(tokens) >= 2 and _is_negator(tokens[0]) and tokens[1] in words:
        return not words[tokens[1]]
    return None


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
    answer / first word / word after "the answer is" first, then all answer words, the negative winning a
    conflict unless ``conflict`` says otherwise."""
    words = _family_words(family)
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(text)
    core_tokens = _tokens(core)
    if len(core_tokens) == 1 and core_tokens[0] in words:
        return Parsed(words[core_tokens[0]])
    leading = _leading_polarity(core, words)
    if leading is not None:
        return Parsed(leading)
    for marked in _ANSWER_MARKER.finditer(_plain(text)):
        leading = _leading_polarity(_core(text[marked.end() :]), words)
        if leading is not None:
            return Parsed(leading)
    if is_refusal(text):
        return Parsed(None, Reason.REFUSAL)
    found = _polarities(text, words)
    if not found:
        return Parsed(None, Reason.NOT_FOUND)
    if len(set(found)) == 1 or conflict == "first":
        return Parsed(found[0])
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
_SCORE_MARKER = re.compile(r"\b(?:answer|rating|score|rate)\s*(?:is|would\s+be|[:=])\s*:?\s*", re.IGNORECASE)


def parse_scale(text: str, low: int = 0, high: int = 10) -> Parsed:
    """An integer rating in ``[low, high]``: the whole answer, else "N/high" or "N out of high", else after
    "rating:"/"score is"/"answer:", else the first integer in range (out-of-range ones are skipped; decimals such
    as "7.5" are not integers), else a number word ("eight"). Integers seen but none in range -> ``out_of_range``.
    Thresholds (keep >= 8, <= 3) are :func:`runner.score.threshold`."""
    if not text.strip():
        return Parsed(None, Reason.EMPTY)

    def in_range(n: int) -> bool:
        return low <= n <= high

    core = _core(text)
    if re.fullmatch(r"-?\d+", core):
        n = int(core)
        return Parsed(n) if in_range(n) else Parsed(None, Reason.OUT_OF_RANGE)
    plain = _plain(text)
    out_of = re.search(rf"(?<![\w.\-])(-?\d+)\s*(?:/|out\s+of)\s*{high}\b", plain, re.IGNORECASE)
    if out_of:
        n = int(out_of.group(1))
        return Parsed(n) if in_range(n) else Parsed(None, Reason.OUT_OF_RANGE)
    for marked in _SCORE_MARKER.finditer(plain):
        number = _INTEGER.match(plain[marked.end() :].lstrip("*([ "))
        if number and in_range(int(number.group(1))):
            return Parsed(int(number.group(1)))
    if is_refusal(text):
        return Parsed(None, Reason.REFUSAL)
    integers = [
        int(m.group(1))
        for m in _INTEGER.finditer(plain)
        if not _DENOMINATOR.search(plain[max(0, m.start() - 12) : m.start()])
    ]
    for n in integers:
        if in_range(n):
            return Parsed(n)
    if integers:
        return Parsed(None, Reason.OUT_OF_RANGE)
    for word in _tokens(text):
        if word in _NUMBER_WORDS:
            n = _NUMBER_WORDS[word]
            return Parsed(n) if in_range(n) else Parsed(None, Reason.OUT_OF_RANGE)
    return Parsed(None, Reason.NOT_FOUND)


# -- label names -----------------------------------------------------------------------------------------------


def parse_label(text: str, labels: Sequence[str], *, marker: str = NONE_OF_THEM_MARKER) -> Parsed:
    """The index in ``labels`` of the label named (Bank-77 intents such as "lost_or_stolen_card").

    The whole answer (decoration and "Answer:" stripped) equal to one label, first exactly, then normalised
    (case-insensitive; spaces, hyphens, underscores and other punctuation equivalent: "Lost or stolen card",
    "lost-or-stolen-card", "reverted card payment" for "reverted_card_payment?"); else exactly one label mentioned
    in the answer (a label inside a longer mentioned label does not count: "exchange_rate" in
    "card_payment_wrong_exchange_rate"). A none-of-them answer picks the marker if it is the last label."""
    if not text.strip():
        return Parsed(None, Reason.EMPTY)
    core = _core(text)
    exact = [i for i, label in enumerate(labels) if label == core or label == text.strip()]
    if len(exact) == 1:
        return Parsed(exact[0])
    same = _same_text(core, labels)
    if len(same) == 1:
        return Parsed(same[0])
    if len(same) > 1:
        return Parsed(None, Reason.AMBIGUOUS)
    slot = _marker_slot(labels, marker)
    if is_none_of_them(text, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(text) and not _ANSWER_MARKER.search(text):
        return Parsed(None, Reason.REFUSAL)
    found = _mentioned(text, labels)
    if len(found) == 1:
        return Parsed(found[0])
    return Parsed(None, Reason.AMBIGUOUS if found else Reason.NOT_FOUND)


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
    none fits (Know-No's hint in the instruction) and ``False`` otherwise (refusals and empty answers invalid)."""
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
        if is_none_of_them(text, marker):
            return Parsed(True)
        return Parsed(None, Reason.REFUSAL) if is_refusal(text) else Parsed(False)
    raise ValueError(f"unknown parser {kind!r}")

