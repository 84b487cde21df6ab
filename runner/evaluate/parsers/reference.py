"""The NewTerm reference rules, reproduced apart for the ``newterm-reference`` scoring mode: letters
(:func:`newterm_reference_letter`) and yes/no (:func:`newterm_reference_yes_no`) as the released evaluation code
reads them."""

from __future__ import annotations

from collections.abc import Sequence

from runner.evaluate.parsers.lazy import lazy_compile

from .parsed import Parsed, Reason

_NON_WORD = lazy_compile(r"[\W_]+")
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
