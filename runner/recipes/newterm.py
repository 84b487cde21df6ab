"""NewTerm benchmark construction (paper appendix tables 3–13): parsers for the generation answers and the steps
that turn them into COMA, COST and CSJ items.

Every rule name is a row of the funnel report, so each is a short sentence and never changes casually.
Fields starting with ``_`` (``_id`` above all) are the engine's; rows that are kept carry them unchanged.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from runner.recipes import Context, Outcome, Parsed, parser, step

# numbering or a bullet before a line's content: "1.", "1)", "(2)", "-", "*", "•", "a)"
_MARKER = re.compile(r"^\s*(?:[-*•]+\s+|\(?\d{1,3}[.)](?=\s|$)|\(?[a-zA-Z]\)(?=\s|$))\s*")
_QUOTES = "\"'“”‘’`"
_NONE = re.compile(r"(?<![\w/])(?:none|n/a)(?![\w/])", re.IGNORECASE)

_CONNECTORS = {
    "effect": re.compile(r"\bas an effect\b\s*,?", re.IGNORECASE),
    "cause": re.compile(r"\bthis happened because\b\s*:?", re.IGNORECASE),
}
# "Paragraph 1:", "**Paragraph 2.**", "1." before a COMA paragraph
_PARAGRAPH_LABEL = re.compile(r"^\s*paragraph\s*(?:\d+\s*[:.)]?|:)\s*", re.IGNORECASE)

_WRONG_SENTENCE = re.compile(r"^wrong\s+sentence\s*\d*\s*:\s*(.*)$", re.IGNORECASE)
_WRONG_MEANING = re.compile(r"^(?:corresponding\s+)?wrong\s+meaning\s*\d*\s*:\s*(.*)$", re.IGNORECASE)


# --- term matching ----------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _term_pattern(term: str) -> re.Pattern[str]:
    """``term`` as a whole word or phrase, case-insensitively. Hyphens and spaces inside it match only
    themselves, so "deadhead" is not found in "dead-head" nor in "deadheading"."""
    return re.compile(rf"(?<!\w){re.escape(term)}(?!\w)", re.IGNORECASE)


def contains_term(text: str, term: str) -> bool:
    """Whether ``term`` occurs in ``text`` as a whole word or phrase, ignoring case."""
    term = term.strip()
    return bool(term) and _term_pattern(term).search(text) is not None


def count_term(text: str, term: str) -> int:
    term = term.strip()
    return len(_term_pattern(term).findall(text)) if term else 0


def replace_term(text: str, old: str, new: str) -> str:
    """``text`` with every whole-word occurrence of ``old`` (any case) replaced by ``new``; an occurrence that
    starts with a capital (a sentence start) gets ``new`` with a capital too."""
    old = old.strip()
    if not old:
        return text

    def substitute(match: re.Match[str]) -> str:
        return new[:1].upper() + new[1:] if match.group(0)[:1].isupper() else new

    return _term_pattern(old).sub(substitute, text)


# --- line cleaning ----------------------------------------------------------------------------------------


def _strip_marker(line: str) -> str:
    """The line without leading numbering or a bullet, and without markdown bold around it."""
    line = _MARKER.sub("", line.strip(), count=1).strip()
    if line.startswith("**") and line.endswith("**") and len(line) > 4:
        line = line[2:-2].strip()
    return line


def _strip_quotes(text: str) -> str:
    """Drop surrounding quotes and a trailing comma or semicolon, in whatever order the model put them."""
    previous = None
    while text != previous:
        previous = text
        text = text.rstrip(",;").strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
            text = text[1:-1].strip()
    return text


def _clean_lines(text: str) -> Iterable[str]:
    """The answer's non-empty lines, numbering, bullets and quotes stripped, whitespace collapsed."""
    for raw in text.splitlines():
        line = " ".join(_strip_quotes(_strip_marker(raw)).split())
        if line:
            yield line


def _key(text: str) -> str:
    """What two strings must share to count as repeated: case and spacing do not matter."""
    return " ".join(text.lower().split())


# --- parsers ----------------------------------------------------------------------------------------------


@parser("newterm.related_lines")
def related_lines(text: str, row: dict[str, Any], args: dict[str, Any]) -> Parsed:
    """Related terms (tables 7–9), one per line. The paper keeps terms of at most five words and drops lines
    that look like explanations (":" or ".") or refusals ("none", "n/a")."""
    term = _key(str(row.get("term", "")))
    return _kept_lines(text, lambda line, seen: _related_rule(line, term, seen))


def _related_rule(line: str, term: str, seen: set[str]) -> str | None:
    if len(line.split()) > 5:
        return "more than 5 words"
    if ":" in line:
        return "contains ':'"
    if "." in line:
        return "contains '.'"
    if _NONE.search(line):
        return "says none or n/a"
    if _key(line) == term:
        return "is the term itself"
    if _key(line) in seen:
        return "repeated"
    return None


@parser("newterm.coma_paragraphs")
def coma_paragraphs(text: str, row: dict[str, Any], args: dict[str, Any]) -> Parsed:
    """COMA paragraphs (table 4): "Sentence 1. As an effect, Sentence 2." (or "This happened because:"), one
    per line. A line holding only a "Paragraph 1:" label is skipped, so the paragraph may follow on its own.
    Sentence 1 must hold the term as a whole word: the distractor prompt (table 10) replaces it there. An empty
    sentence is reported as such before the term check, which an empty sentence 1 would otherwise fail."""
    split = row["split"]
    connector = _CONNECTORS[split]
    other = _CONNECTORS["cause" if split == "effect" else "effect"]
    term = str(row.get("term", ""))
    out = Parsed(items=[])
    seen: set[tuple[str, str]] = set()
    for raw in text.splitlines():
        line = _strip_marker(raw).replace("**", "")
        line = _strip_quotes(_strip_marker(_PARAGRAPH_LABEL.sub("", line)))
        if not line:
            continue
        match = connector.search(line)
        if not match:
            out.rejected["wrong connector" if other.search(line) else "no connector"] += 1
            continue
        question, answer = line[:match.start()].strip(), line[match.end():].strip()
        key = (_key(question), _key(answer))
        rule = ("empty sentence" if not question or not answer
                else "term missing from sentence 1" if not contains_term(question, term)
                else "repeated" if key in seen else None)
        if rule:
            out.rejected[rule] += 1
            continue
        seen.add(key)
        out.items.append({"question": question, "answer": answer})
    return out


@parser("newterm.term_sentences")
def term_sentences(text: str, row: dict[str, Any], args: dict[str, Any]) -> Parsed:
    """Sentences about a term (tables 4 and 5), one per line; ``args["field"]`` names the row field that
    must occur in each (the term, or for COST's second half the related term the sentence is about)."""
    value = str(row.get(args.get("field", "term"), ""))
    return _kept_lines(text, lambda line, seen: (
        "does not contain the term" if not contains_term(line, value)
        else "fewer than 4 words" if len(line.split()) < 4
        else "repeated" if _key(line) in seen else None))


def _kept_lines(text: str, rule_of: Callable[[str, set[str]], str | None]) -> Parsed:
    """The answer's cleaned lines that break no rule (``rule_of(line, keys seen)`` names the one broken),
    and how many each rule rejected."""
    out = Parsed(items=[])
    seen: set[str] = set()
    for line in _clean_lines(text):
        rule = rule_of(line, seen)
        if rule:
            out.rejected[rule] += 1
            continue
        seen.add(_key(line))
        out.items.append(line)
    return out


@parser("newterm.wrong_sentences")
def wrong_sentences(text: str, row: dict[str, Any], args: dict[str, Any]) -> Parsed:
    """CSJ's illogical rewrites (table 6): "Wrong Sentence: X" then "Corresponding Wrong meaning: Y". Either
    label may stand alone with its text on the next line; lines outside the pairs (the model's restatement
    of the original sentences, a preamble) are ignored."""
    term = str(row.get("term", ""))
    out = Parsed(items=[])
    pairs, unpaired, labels = _wrong_pairs(text)
    if not labels:
        out.rejected["no 'Wrong Sentence:' lines"] += 1
        return out
    if unpaired:
        out.rejected["no wrong meaning"] += unpaired
    seen: set[str] = set()
    for sentence, meaning in pairs:
        rule = ("does not contain the term" if not contains_term(sentence, term)
                else "repeated" if _key(sentence) in seen else None)
        if rule:
            out.rejected[rule] += 1
            continue
        seen.add(_key(sentence))
        out.items.append({"sentence": sentence, "wrong_meaning": meaning})
    return out


def _wrong_pairs(text: str) -> tuple[list[tuple[str, str]], int, int]:
    """(sentence, meaning) pairs, the number of wrong sentences left without a meaning, and the number of
    "Wrong Sentence:" labels seen. ``waiting`` says which label's text is still to come on a later line."""
    pairs: list[tuple[str, str]] = []
    unpaired = labels = 0
    sentence: str | None = None
    waiting: str | None = None
    for raw in text.splitlines():
        line = _strip_marker(raw).replace("**", "").strip()
        if not line:
            continue
        is_sentence, is_meaning = _WRONG_SENTENCE.match(line), _WRONG_MEANING.match(line)
        if is_sentence:
            labels += 1
            unpaired += sentence is not None
            sentence = _strip_quotes(is_sentence.group(1)) or None
            waiting = None if sentence else "sentence"
        elif is_meaning or waiting == "meaning":
            meaning = _strip_quotes(is_meaning.group(1) if is_meaning else line)
            if sentence is not None and meaning:
                pairs.append((sentence, meaning))
                sentence, waiting = None, None
            else:
                waiting = "meaning" if sentence is not None else None
        elif waiting == "sentence":
            sentence, waiting = _strip_quotes(line), None
    unpaired += sentence is not None
    return pairs, unpaired, labels


# --- steps ------------------------------------------------------------------------------------------------


def _each_row(rows: list[dict[str, Any]], build: Callable[[dict[str, Any]], dict[str, Any] | str]) -> Outcome:
    """Apply ``build`` to every row: it returns the row to keep, or the rule that drops it."""
    out = Outcome(rows=[])
    for row in rows:
        result = build(row)
        if isinstance(result, str):
            out.dropped[result] += 1
        else:
            out.rows.append(result)
    return out


@step("newterm.related_terms")
def related_terms(rows: list[dict[str, Any]], args: dict[str, Any], ctx: Context) -> Outcome:
    """The paper's five related terms per new term: the generated lists in priority order, reduced by greedy
    embedding de-duplication (the most similar pair loses its lower-priority member until ``count`` remain),
    written to ``args.as`` (default ``related``). Run again on ``related`` with ``count: 2`` it picks the two most
    distinct of the five, as the released code does for the second half of COST."""
    fields = list(args["fields"])
    count = int(args.get("count", 5))
    target = str(args.get("as", "related"))

    def build(row: dict[str, Any]) -> dict[str, Any] | str:
        candidates = _candidates(row, fields)
        kept = _dedupe_greedy(candidates, count, ctx.similarity) if len(candidates) > count else candidates
        if len(kept) < count:
            return f"fewer than {count} distinct related terms"
        return {**row, target: kept}

    return _each_row(rows, build)


def _candidates(row: dict[str, Any], fields: list[str]) -> list[str]:
    term = _key(str(row.get("term", "")))
    seen = {term}
    out: list[str] = []
    for name in fields:
        for candidate in row.get(name) or []:
            if _key(candidate) not in seen:
                seen.add(_key(candidate))
                out.append(candidate)
    return out


def _dedupe_greedy(candidates: list[str], count: int, similarity: Any) -> list[str]:
    """Drop the later member of the most similar remaining pair until ``count`` remain (first pair on ties)."""
    sims = similarity.matrix(candidates, candidates)
    alive = list(range(len(candidates)))
    while len(alive) > count:
        best: tuple[float, int] | None = None
        for a, i in enumerate(alive):
            for j in alive[a + 1:]:
                if best is None or sims[i][j] > best[0]:
                    best = (sims[i][j], j)
        assert best is not None
        alive.remove(best[1])
    return [candidates[i] for i in alive]


@step("newterm.filter_choices")
def filter_choices(rows: list[dict[str, Any]], args: dict[str, Any], ctx: Context) -> Outcome:
    """Apply the filter model's verdict (tables 11/12): it must choose the gold, the wrong options it chose are
    plausible and so removed, and the rest is cut to ``keep`` by removing the options closest to the gold."""
    keep = int(args.get("keep", 4))
    protect = args.get("protect")

    def build(row: dict[str, Any]) -> dict[str, Any] | str:
        options: list[str] = row["options"]
        gold: int = row["gold"]
        if row.get("selected") is None:
            return "filter answer unreadable"
        selected = {i for i in row["selected"] if 0 <= i < len(options)}
        if gold not in selected:
            return "filter did not choose the correct answer"
        plausible = selected - {gold}
        protected = _option_index(options, row.get(protect)) if protect else None
        if protected is not None and protected in plausible:
            return "the term was judged plausible"
        remaining = [i for i in range(len(options)) if i not in plausible]
        if len(remaining) < keep:
            return f"fewer than {keep} options left"
        remaining = _cut_closest(options, remaining, gold, protected, keep, ctx.similarity)
        kept = {k: v for k, v in row.items() if k not in ("options", "selected")}
        return {**kept, "choices": [options[i] for i in remaining], "gold": remaining.index(gold),
                "dropped_as_plausible": len(plausible)}

    return _each_row(rows, build)


def _option_index(options: list[str], value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    return next((i for i, option in enumerate(options) if _key(option) == _key(value)), None)


def _cut_closest(options: list[str], remaining: list[int], gold: int, protected: int | None, keep: int,
                 similarity: Any) -> list[int]:
    """Remove the wrong options most similar to the gold (the most confusable as synonyms, not as
    distractors) until ``keep`` remain. The gold is fixed, so one row of similarities serves every removal."""
    if len(remaining) <= keep:
        return remaining
    removable = [i for i in remaining if i not in (gold, protected)]
    sims = similarity.matrix([options[gold]], [options[i] for i in removable])[0]
    by_closeness = sorted(range(len(removable)), key=lambda k: (-sims[k], k))
    drop = {removable[k] for k in by_closeness[:len(remaining) - keep]}
    return [i for i in remaining if i not in drop]


@step("newterm.cost_items")
def cost_items(rows: list[dict[str, Any]], args: dict[str, Any], ctx: Context) -> Outcome:
    """COST questions: the sentence with its answer term blanked as "_" (the released files' blank), the
    options the term and its related terms (table 12 shows six)."""

    def build(row: dict[str, Any]) -> dict[str, Any] | str:
        sentence, answer = row["sentence"], row["answer_term"]
        occurrences = count_term(sentence, answer)
        if occurrences == 0:
            return "sentence lacks its answer"
        if occurrences > 1:
            return "answer appears more than once"
        options = _unique([row["term"], *row.get("related", [])])
        gold = _option_index(options, answer)
        if gold is None:
            return "answer is not an option"
        return {**row, "question": _term_pattern(answer.strip()).sub("_", sentence), "options": options,
                "gold": gold}

    return _each_row(rows, build)


def _unique(values: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for value in values:
        if _key(value) not in seen:
            seen.add(_key(value))
            out.append(value)
    return out


_SCHEMA = {
    "COMA": ("term", "meaning", "type", "question", "split", "choices", "gold"),
    "COST": ("term", "meaning", "type", "question", "choices", "gold"),
    "CSJ": ("term", "meaning", "type", "question", "gold"),
}


@step("newterm.finalize")
def finalize(rows: list[dict[str, Any]], args: dict[str, Any], ctx: Context) -> Outcome:
    """Rows in the released files' schema. Choices are shuffled with a seed and the row's own text, so the
    order does not depend on row order or process; ``_shuffle[shown] = original index`` records it."""
    task = args["task"]
    fields = _SCHEMA[task]
    seed = args.get("seed", ctx.seed)

    def build(row: dict[str, Any]) -> dict[str, Any] | str:
        if any(row.get(name) is None for name in fields):
            return "missing field"
        out = {name: value for name, value in row.items() if name.startswith("_")}
        out.update({name: row[name] for name in fields})
        if task == "CSJ":
            out["gold"] = bool(row["gold"])
            return out
        perm = list(range(len(row["choices"])))
        random.Random(f"{seed}|{row['term']}|{row['question']}").shuffle(perm)
        out.update(choices=[row["choices"][i] for i in perm], gold=perm.index(row["gold"]),
                   _shuffle=perm, _shuffle_seed=seed)
        return out

    return _each_row(rows, build)

