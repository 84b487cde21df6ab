"""What a grader reads of an answer: its text without thinking, a JSON answer's field or a ``\\boxed{}`` answer,
normalised (NFKC, quotes, CJK split from Latin letters); and its words, British and American spellings made one,
and its core without decoration ("Answer:", brackets, markdown)."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Sequence

from runner.evaluate.parsers.lazy import lazy_compile

_THINK_TAG = r"(?:think|thinking|reasoning)"
_THINK_BLOCK = lazy_compile(rf"<({_THINK_TAG})\s*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = lazy_compile(rf"</{_THINK_TAG}\s*>", re.IGNORECASE)
_THINK_OPEN = lazy_compile(rf"\s*<{_THINK_TAG}\s*>", re.IGNORECASE)
_FENCED = lazy_compile(r"```[\w-]*[ \t]*\n?(.*?)\n?```", re.DOTALL)
#: the fields of a JSON answer that hold the answer, in order of preference
_ANSWER_KEYS = ("final_answer", "answer", "choice", "option", "letter", "label", "intent", "category", "class",
                "rating", "score", "verdict", "judgment", "judgement", "prediction")
_BOXED = lazy_compile(r"\\(?:boxed|fbox)\s*\{")
_TEX_WRAP = lazy_compile(r"\\(?:text|textbf|textit|texttt|textrm|mathrm|mathbf|mathit|mbox)\s*\{([^{}]*)\}")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_CJK_EDGE = lazy_compile(rf"(?<=[{_CJK}])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=[{_CJK}])")


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


def normalised(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return _CJK_EDGE.sub(" ", text)


def answer_text(text: str) -> str:
    """What a grader reads: the answer without thinking, a JSON answer's field or a boxed answer, normalised."""
    text = _strip_thinking(text)
    found = _json_answer(text)
    if found is None:
        found = _boxed_answer(text)
    return normalised(text if found is None else found)


def graded_text(text: str) -> str | None:
    """:func:`answer_text`, or None when a grader has nothing to read (an empty answer, or thinking never closed)."""
    if not text.strip():
        return None
    answer = answer_text(text)
    return answer if answer.strip() else None


#: words (letters and digits), contractions kept whole so "I'm" is no letter "I"
WORD = lazy_compile(r"[^\W_]+(?:'[^\W_]+)*")
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
    (lazy_compile(r"^(\w{2,})is(e|es|ed|ing|ation|ations|er|ers)$"), r"\1iz\2"),  # authorise, recognised
    (lazy_compile(r"^(\w+)ys(e|es|ed|ing)$"), r"\1yz\2"),  # analyse
    (lazy_compile(r"^(col|fav|behavi|hon|lab|neighb|flav|hum|harb|rum|sav|arm|vap|endeav|rig|od|val|cand|splend)our"),
     r"\1or"),  # colour, favourite
    (lazy_compile(r"^(cancel|label|travel|model|fuel|total|signal|counsel|level|channel|dial|equal|marvel|tunnel"
                r"|quarrel|rival|initial|jewel)l(ed|ing|er|ers)$"), r"\1\2"),  # cancelled, labelled
)


@functools.lru_cache(maxsize=65536)
def spelling(word: str) -> str:
    """One spelling for British and American variants of a lowercase word (applied to both sides of a match)."""
    if word in _BRITISH:
        return _BRITISH[word]
    for pattern, replacement in _BRITISH_RULES:
        word = pattern.sub(replacement, word)
    return word


def tokens_of(text: str) -> list[str]:
    return [spelling(word) for word in WORD.findall(normalised(text).lower())]


@functools.lru_cache(maxsize=4096)
def name_tokens(name: str) -> tuple[str, ...]:
    """An option's or label's words (the same few names are looked for in every answer)."""
    return tuple(tokens_of(name))


_ANSWER_PREFIX = lazy_compile(
    r"^(?:(?:the|my|your|final|correct|best)\s+)*(?:answer|choice|option|letter|réponse|antwort|respuesta)\b"
    r"\s*(?:is\b|would\s+be\b|est\b|ist\b|es\b|[:=\-])?\s*:?\s*",
    re.IGNORECASE,
)
_PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def answer_core(text: str) -> str:
    """The answer without decoration: whitespace, markdown, quotes, surrounding brackets, a trailing period, and a
    leading "Answer:" / "The answer is" / "Option"."""
    s = normalised(text).strip()
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


def same_text(core: str, names: Sequence[str]) -> list[int]:
    words = tuple(tokens_of(core))
    return [i for i, name in enumerate(names) if words and name_tokens(name) == words]
