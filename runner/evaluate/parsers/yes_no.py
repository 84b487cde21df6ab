"""Yes/no answers in a family of answer words (yes/no, correct/incorrect, acceptable/unacceptable, true/false),
negation applied (:func:`parse_yes_no`), read as ``runner.evaluate.parse`` describes."""

from __future__ import annotations

import re
from typing import Literal

from runner.evaluate.parsers.lazy import lazy_compile

from .parsed import Parsed, Reason
from .refusals import is_none_of_them, is_refusal
from .statements import stated_answer
from .text import WORD, answer_core, graded_text

#: answer-word families: name -> (positive word, negative word)
YES_NO_FAMILIES: dict[str, tuple[str, str]] = {
    "yes/no": ("yes", "no"),
    "correct/incorrect": ("correct", "incorrect"),
    "acceptable/unacceptable": ("acceptable", "unacceptable"),
    "true/false": ("true", "false"),
}
#: the same answers in other words (other languages, colloquial), read only as the whole answer, its first word or
#: after "Answer:"; Chinese and Japanese text is one word up to punctuation ("不，这句话不对" starts with "不")
_OTHER_WORDS: dict[str, dict[str, bool]] = {
    "yes/no": {"oui": True, "ja": True, "sí": True, "si": True, "yep": True, "yup": True, "yeah": True, "yea": True,
               "uhhuh": True, "mmhmm": True, "mhm": True,
               "是": True, "是的": True, "对": True, "對": True, "对的": True, "是啊": True, "没错": True, "沒錯": True,
               "はい": True, "ええ": True, "うん": True, "そうです": True,
               "non": False, "nein": False, "nope": False, "nah": False, "uhuh": False, "nuhuh": False,
               "否": False, "不": False, "不是": False, "不是的": False, "不对": False, "不對": False, "没有": False,
               "沒有": False, "いいえ": False, "いや": False, "ううん": False, "違います": False, "違う": False},
    "correct/incorrect": {"correcte": True, "correcta": True, "correcto": True, "richtig": True, "正确": True,
                          "正確": True, "对": True, "對": True, "正しい": True, "正解": True,
                          "incorrecte": False, "incorrecta": False, "incorrecto": False, "falsch": False,
                          "错误": False, "錯誤": False, "错": False, "錯": False, "不正确": False, "不正確": False,
                          "不对": False, "不對": False, "正しくない": False, "間違い": False, "誤り": False},
}
#: hyphenated answers, made one word before reading ("Uh-huh" is yes, "Uh-uh" no)
_HYPHENATED = lazy_compile(r"\b(?:uh-huh|mm-hmm|uh-uh|nuh-uh)\b(?!-)", re.IGNORECASE)
_NEGATORS = frozenset({"not", "never", "hardly", "cannot", "neither", "nor"})
#: a negation reaches no further than its clause: punctuation, a dash or a hyphen between spaces ("Not bad - correct")
_YES_NO_CLAUSE = lazy_compile(r"[.,;:!?\n\u2013\u2014]|\s-+\s")
#: words after which a leading "no" is the answer, not a determiner ("No it isn't" but "No issues")
_NO_ANSWERS = frozenset(
    "it it's its this that these those the a an i i'm i'd there there's they he she we you not because since but as "
    "so definitely absolutely certainly never way sir way".split()
)
#: a negation standing for the negative answer: "Absolutely not.", "Not at all", "Not really"
_BARE_NOT = lazy_compile(
    r"(?:(?:absolutely|definitely|certainly|of\s+course|surely|clearly)\s+)?not(?:\s+(?:really|at\s+all|quite))?!?",
    re.IGNORECASE,
)
_ASKED = lazy_compile(r"[^.!\n?]*\?")  # the rest of the sentence is a question ("Correct or incorrect? ...")
_HEDGE_GAP = lazy_compile(r"\s*(?:/|,?\s*(?:or|and|nor|oder|und|ou|et|o|y|maybe|perhaps)\b)\s*", re.IGNORECASE)


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
        words.update(_OTHER_WORDS.get(key, {}))
    for positive, negative in pairs:
        words[positive.lower()] = True
        words[negative.lower()] = False
    return words


def _is_negator(word: str) -> bool:
    return word in _NEGATORS or word.endswith("n't")


def _polarities(text: str, words: dict[str, bool]) -> list[tuple[bool, int, int, int]]:
    """(polarity, start, end, word index) of every answer word in order, negation applied."""
    matches = list(WORD.finditer(text))
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


def _hedge(text: str, found: list[tuple[bool, int, int, int]]) -> Parsed | None:
    """Both sides named as alternatives: "yes or no", "yes and no", "correct/incorrect"; or neither affirmed:
    "neither yes nor no"."""
    for a, b in zip(found, found[1:], strict=False):
        gap = text[a[2] : b[1]]
        if a[0] != b[0] and _HEDGE_GAP.fullmatch(gap):
            neither = "nor" in gap.lower().split()
            return Parsed(None, Reason.AMBIGUOUS, "neither answer affirmed" if neither else "both answers named")
    return None


def _leading_polarity(text: str, words: dict[str, bool]) -> bool | None:
    found = _polarities(text, words)
    if not found:
        return None
    polarity, _, _, k = found[0]
    first = WORD.findall(text)[:1]
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
    answer = graded_text(text)
    if answer is None:
        return Parsed(None, Reason.EMPTY)
    answer = _HYPHENATED.sub(lambda m: m.group().replace("-", ""), answer)
    core = answer_core(answer)
    core_tokens = WORD.findall(core.lower())
    if len(core_tokens) == 1 and core_tokens[0] in leading_words:
        return Parsed(leading_words[core_tokens[0]])

    def read_at(offset: int) -> Parsed | None:
        rest = answer_core(answer[offset:])
        hedge = _hedge(rest, _polarities(rest, leading_words)[:2])
        if hedge is not None:
            return hedge
        polarity = _leading_polarity(rest, leading_words)
        return None if polarity is None else Parsed(polarity)

    stated = stated_answer(answer, read_at)
    if stated is not None:
        return stated
    found = _polarities(answer, words)
    hedge = _hedge(answer, found)
    if hedge is not None:
        return hedge
    leading = _leading_polarity(core, leading_words)
    if leading is not None:
        return Parsed(leading)
    if _BARE_NOT.fullmatch(core):
        return Parsed(False)
    if is_none_of_them(answer, named=True):  # "None of the options is correct" holds no "correct" answer
        return Parsed(None, Reason.NONE_OF_THEM, "says no option fits")
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    if not found:
        return Parsed(None, Reason.NOT_FOUND, "no answer word")
    polarities = [polarity for polarity, *_ in found]
    if len(set(polarities)) == 1 or conflict == "first":
        return Parsed(polarities[0])
    if conflict == "invalid":
        return Parsed(None, Reason.CONFLICT, "both answers stated")
    return Parsed(False)
