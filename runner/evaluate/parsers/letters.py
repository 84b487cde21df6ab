"""Letters: one chosen option (:func:`parse_letter`, strict or lenient) or a set of them (:func:`parse_letters`),
read as ``runner.evaluate.parse`` describes."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from typing import Literal

from runner.evaluate.parsers.lazy import lazy_compile
from runner.plan.choices import LETTERS, NONE_OF_THEM_MARKER

from .parsed import Parsed, Reason
from .reader import LIST_GAP, Reader, choose, list_bounds, name_mentions, ruled_out
from .refusals import is_none_of_them, is_refusal, marker_slot
from .statements import CHOSEN, stated_answer
from .text import WORD, answer_core, graded_text, name_tokens, same_text, tokens_of

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


_LEADING = lazy_compile(
    r"^[\s*_`\"'(\[#]*(?i:(?:(?:the|my|final|correct)\s+)*(?:answer|option|choice)\s*(?:is|:)?\s*:?\s*)?"
    r"[*(\[]*([^\W_])(?![^\W_])[*)\]]*\s*(?:[.:),;\-]|$|\n)"
)
_OPTION_LINE = lazy_compile(r"^[\s*#>\-]*[(\[]?([A-Z])[.)\]:]\s+\S", re.MULTILINE)
_LEAD_IN = frozenset("option choice letter the la le die el opción opzione".split())
_ARTICLES = frozenset({"a", "an", "the"})
#: a line that starts with an option's label: "A. carrot", "(B) apple", "- **C)** potato", "| D | onion |"
_LABEL_LINE = lazy_compile(
    r"^[ \t>#*\-]*(?:\|[ \t]*\**[(\[]?([A-Z])[)\]]?\**[ \t]*\||\**[(\[]?\**([A-Z])\**[.)\]:]\**[ \t]+\S)",
    re.MULTILINE,
)
_AFFIRMING = frozenset("correct right true yes best answer".split())
_DENYING = frozenset("not never no incorrect wrong false".split())
#: between two options echoed in one line: "A) carrot, B) apple", "(A) carrot (B) apple", "A. carrot; B. apple"
_ECHO_GAP = lazy_compile(r"[\s,;/|*\-()\[\]]*(?:(?:and|or)[\s(\[*]*)?")


def _lone_letter(core: str, valid: str) -> int | None:
    if len(core) != 1:
        return None
    for candidate in (core, core.upper(), core.lower()):
        if candidate in valid:
            return valid.index(candidate)
    return None


def _option_text_after(r: Reader, k: int, option: str) -> int:
    """The last word of ``option``'s text right after the label at word ``k`` ("A) carrot"), or ``k``."""
    needle = list(name_tokens(option))
    if needle and r.lower[k + 1 : k + 1 + len(needle)] == needle:
        return k + len(needle)
    return k


def _affirmed(r: Reader, k: int, end: int) -> bool:
    """Whether the rest of the line of the label at word ``k`` (its option's text ending at word ``end``) says it
    is the answer: "B. apple - correct", "| B | right |"; not "A. carrot - not correct"."""
    line_end = r.text.find("\n", r.spans[k][1])
    stop = len(r.words) if line_end < 0 else bisect.bisect_left(r.starts, line_end)
    rest = r.lower[end + 1 : stop]
    return bool(_AFFIRMING.intersection(rest)) and not any(w in _DENYING or w.endswith("n't") for w in rest)


def _echoed(r: Reader, valid: str, options: Sequence[str]) -> tuple[set[int], list[set[int]]]:
    """The words of an echoed option list, which chooses nothing: labels that start two or more lines, each letter
    once ("A. carrot\nB. apple", a markdown table's rows; the per-option analysis of a chain of thought too), with
    their option's text, unless the line says the option is the answer ("B. apple - correct"); and two or more
    labelled options in a row within a line ("The options are A) carrot, B) apple, C) potato"). Also, per list, the
    labels its lines affirm."""
    out: set[int] = set()
    affirmed: list[set[int]] = []
    block: list[int] = []
    for m in [*_LABEL_LINE.finditer(r.text), None]:
        letter = (m.group(1) or m.group(2)) if m else None
        k = r.at(m.start(1) if m.group(1) else m.start(2)) if m else None
        if block and (k is None or letter not in valid or letter in [r.words[b] for b in block]):
            kept = set()
            for b in block if len(block) >= 2 else ():
                end = _option_text_after(r, b, options[valid.index(r.words[b])])
                out.update(range(b + 1, end + 1))
                if _affirmed(r, b, end):
                    kept.add(b)
                else:
                    out.add(b)
            affirmed.append(kept)
            block = []
        if k is not None and letter in valid and r.words[k] == letter:
            block.append(k)
    items = []  # (label word, last word of its text) of options labelled in line: "A) carrot"
    for k, word in enumerate(r.words[:-1]):
        if len(word) == 1 and word in valid and r.text[r.spans[k][1] : r.spans[k][1] + 1] in (".", ")", ":", "]"):
            end = _option_text_after(r, k, options[valid.index(word)])
            if end > k:
                items.append((k, end))
    run: list[tuple[int, int]] = []
    for item in [*items, None]:
        joined = run and item and r.words[item[0]] > r.words[run[-1][0]] \
            and _ECHO_GAP.fullmatch(r.text[r.spans[run[-1][1]][1] : r.starts[item[0]]])
        if not joined:
            if len(run) >= 2:
                out.update(j for a, b in run for j in range(a, b + 1))
            run = []
        if item:
            run.append(item)
    return out, affirmed


def _looks_like_letter(char: str) -> bool:
    return len(char) == 1 and (char.isdigit() or "A" <= char <= "Z")


_HEDGES = frozenset("maybe perhaps possibly probably".split())


def _letter_reader(
    r: Reader, valid: str, options: Sequence[str] | None, echoed: set[int]
) -> Callable[[int], Parsed | None]:
    """Reads the letter (or, given ``options``, the option text) right after a marker: "is C", ": (c).", "is A
    cake" (option text), "is option D"; "is A or C", "is B/C" and "is maybe B, maybe C" are ambiguous, "is not A"
    and an echoed option list ("each option:\nA. carrot\nB. apple") nothing."""
    mentions = name_mentions(r, options) if options else []

    def read_at(offset: int) -> Parsed | None:
        k = r.at(offset, _LEAD_IN)
        if k is None or k in echoed:
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
            return Parsed(None, Reason.OUT_OF_RANGE, "letter not offered") if _looks_like_letter(word) else None
        j = k + 1
        hedged = j < len(r.words) and r.text[r.spans[k][1] : r.starts[j]].strip() == "/"  # "B/C"
        if j < len(r.words) and r.lower[j] == "or":
            j, hedged = j + 1, True
        while j < len(r.words) and r.lower[j] in _HEDGES:
            j, hedged = j + 1, True
        if hedged and j < len(r.words) and r.words[j] in valid and r.sentence[j] == r.sentence[k]:
            return Parsed(None, Reason.AMBIGUOUS, "two choices stated")  # "B or C", "maybe B, maybe C"
        return Parsed(index)

    return read_at


def _leading_label(
    answer: str, r: Reader, spots: list[tuple[int, int, int]], echoed: set[int]
) -> str | None:
    """The letter an answer starts with as its label ("B. apple", "C, not A"), unless the options are echoed, or
    the letter is ruled out or one of a list ("(C) and (D) are wrong, so B", "A, B and C are wrong", "B, C")."""
    leading = _LEADING.match(answer)
    if not leading or len(set(_OPTION_LINE.findall(answer))) >= 2:
        return None
    letter = leading.group(1)
    k = r.at(leading.start(1))
    if k in echoed:
        return None
    names = {a for a, _, _ in spots}
    for i, ((a, b, _), (first, last)) in enumerate(zip(spots, list_bounds(r, spots), strict=True)):
        listed = i + 1 < len(spots) and LIST_GAP.fullmatch(r.text[r.spans[b][1] : r.starts[spots[i + 1][0]]])
        if a == k and (listed or (first, last) != (a, b) or ruled_out(r, first, last, names)):
            return None
    return letter


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
    echoed, affirmed = _echoed(r, valid, options)
    if mode == "strict":
        stated = stated_answer(answer, _letter_reader(r, valid, None, echoed))
        if stated is not None and (stated.valid or stated.reason == Reason.OUT_OF_RANGE):
            return stated
        if slot is not None and tokens_of(core) in (tokens_of(marker), tokens_of(options[slot])):
            return Parsed(slot)
        if is_refusal(answer):
            return Parsed(None, Reason.REFUSAL)
        if out_of_range:
            return Parsed(None, Reason.OUT_OF_RANGE, "letter not offered")
        why = stated.detail if stated is not None and stated.detail else "options echoed" if echoed else None
        return Parsed(None, Reason.NOT_STRICT, why or "no final answer")
    same = same_text(core, options)
    if len(same) == 1:
        return Parsed(same[0])
    stated = stated_answer(answer, _letter_reader(r, valid, options, echoed), CHOSEN)
    if stated is not None:
        return stated
    spots = [
        (k, k, valid.index(w)) for k, w in enumerate(r.words) if len(w) == 1 and w in valid and not _not_a_letter(r, k)
    ]
    leading = _leading_label(answer, r, spots, echoed)
    if leading is not None and leading in valid:
        return Parsed(valid.index(leading))
    out_of_range = out_of_range or (leading is not None and _looks_like_letter(leading))
    if is_none_of_them(answer, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM, "no option offered for it")
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    if any(len({r.words[k] for k in kept}) >= 2 for kept in affirmed):
        return Parsed(None, Reason.AMBIGUOUS, "two choices affirmed")  # "A: correct\nB: correct\nC: wrong"
    named = [spot for spot in spots if spot[0] not in echoed]
    mentioned = [spot for spot in name_mentions(r, options) if spot[0] not in echoed]
    found = choose(r, named) or choose(r, mentioned)
    if found is not None:
        return found
    if out_of_range:
        return Parsed(None, Reason.OUT_OF_RANGE, "letter not offered")
    if named or mentioned:
        return Parsed(None, Reason.NOT_FOUND, "negated every option")
    return Parsed(None, Reason.NOT_FOUND, "options echoed" if echoed else "no choice stated")


# -- a set of letters ------------------------------------------------------------------------------------------

_LIST_FILLER = frozenset({"and", "or", "option", "options", "letter", "letters", "choice", "choices", "both"})
_LIST_PUNCT = lazy_compile(r"^[\s,;/&+().\[\]*:\-]*$")


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
    spots = [(k, k, valid.index(word)) for k, word in enumerate(r.words) if len(word) == 1 and word in valid]
    named = {k for k, _, _ in spots}
    chosen_set = {
        value for (k, _, value), (first, last) in zip(spots, list_bounds(r, spots), strict=True)
        if not _not_a_letter(r, k) and not ruled_out(r, first, last, named)
    }
    if chosen_set:
        return Parsed(tuple(sorted(chosen_set)))
    return Parsed(None, Reason.NOT_FOUND, "negated every option" if spots else "no choice stated")
