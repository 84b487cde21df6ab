"""Letters: one chosen option (:func:`parse_letter`, strict or lenient) or a set of them (:func:`parse_letters`),
read as ``runner.evaluate.parse`` describes."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

from runner.plan.choices import LETTERS, NONE_OF_THEM_MARKER

from .parsed import Parsed, Reason
from .reader import Reader, choose, name_mentions, ruled_out
from .refusals import is_none_of_them, is_refusal, marker_slot
from .statements import CHOSEN, stated_answer
from .text import WORD, answer_core, graded_text, same_text, tokens_of

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


def _not_a_letter(r: Reader, k: int) -> bool:
    """The article "A" before a lowercase word ("A careful reading") or the pronoun "I" ("I think")."""
    word = r.words[k]
    if word not in ("A", "I") or k + 1 == len(r.words) or r.text[r.spans[k][1] : r.starts[k + 1]].strip():
        return False
    following = r.words[k + 1]
    if word == "I" and following.lower() in _PRONOUN_NEXT:
        return True
    named = k > 0 and r.lower[k - 1] in _NAMING and not r.text[r.spans[k - 1][1] : r.starts[k]].strip()
    return following[:1].islower() and following.lower() not in _LETTER_NEXT and not named


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


def _letter_reader(r: Reader, valid: str, options: Sequence[str] | None) -> Callable[[int], Parsed | None]:
    """Reads the letter (or, given ``options``, the option text) right after a marker: "is C", ": (c).", "is A
    cake" (option text), "is option D"; "is A or C" is ambiguous, "is not A" nothing."""
    mentions = name_mentions(r, options) if options else []

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
    answer = graded_text(text)
    if answer is None:
        return Parsed(None, Reason.EMPTY)
    core = answer_core(answer)
    lone = _lone_letter(core, valid)
    if lone is not None:
        return Parsed(lone)
    slot = marker_slot(options, marker)
    out_of_range = _looks_like_letter(core)
    r = Reader(answer)
    if mode == "strict":
        stated = stated_answer(answer, _letter_reader(r, valid, None))
        if stated is not None and (stated.valid or stated.reason == Reason.OUT_OF_RANGE):
            return stated
        if slot is not None and tokens_of(core) in (tokens_of(marker), tokens_of(options[slot])):
            return Parsed(slot)
        if is_refusal(answer):
            return Parsed(None, Reason.REFUSAL)
        return Parsed(None, Reason.OUT_OF_RANGE if out_of_range else Reason.NOT_STRICT)
    same = same_text(core, options)
    if len(same) == 1:
        return Parsed(same[0])
    stated = stated_answer(answer, _letter_reader(r, valid, options), CHOSEN)
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
    found = choose(r, spots) or choose(r, name_mentions(r, options))
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
    answer = graded_text(text)
    if answer is None:
        return Parsed(None, Reason.EMPTY)
    core = answer_core(answer)
    words = WORD.findall(core)
    if (
        words
        and _LIST_PUNCT.match(WORD.sub(" ", core))
        and all(len(w) == 1 or w.lower() in _LIST_FILLER for w in words)
    ):
        picked = [w for w in words if len(w) == 1]
        if picked:
            chosen = {_lone_letter(w, valid) for w in picked}
            if None in chosen:
                return Parsed(None, Reason.OUT_OF_RANGE)
            return Parsed(tuple(sorted(i for i in chosen if i is not None)))
    slot = marker_slot(options, marker)
    if is_none_of_them(answer, marker):
        return Parsed((slot,)) if slot is not None else Parsed(None, Reason.NONE_OF_THEM)
    if is_refusal(answer) and not stated_answer(answer, lambda end: Parsed(end)):
        return Parsed(None, Reason.REFUSAL)
    r = Reader(answer)
    named = {k for k, word in enumerate(r.words) if len(word) == 1 and word in valid}
    chosen_set = {
        valid.index(r.words[k]) for k in named if not _not_a_letter(r, k) and not ruled_out(r, k, k, named)
    }
    if chosen_set:
        return Parsed(tuple(sorted(chosen_set)))
    return Parsed(None, Reason.NOT_FOUND)
