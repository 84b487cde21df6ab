"""Answer parsers: read a model's final answer as a careful human grader would. Each returns a :class:`Parsed`: a
value, or ``None`` with the reason class it is invalid. When in doubt, the answer is invalid, never a guessed choice.

Reason classes (:class:`Reason`): ``empty``, ``refusal``, ``not_found`` (nothing recognisable), ``not_strict``
(strict mode: no explicit letter), ``ambiguous`` (a hedge, or several options, labels or numbers named alike),
``out_of_range`` (a letter or number outside the offered ones, e.g. "D. Rick" with options A-C), ``none_of_them``
(the answer says no option fits, but no none-of-them option was offered), ``conflict`` (yes and no, with
``conflict="invalid"``). Invalid answers are scored wrong. Where the class alone does not say why, ``Parsed.detail``
does in a few words ("options echoed", "two choices named", "negated every option", "neither answer affirmed"), and
the result line's ``invalid_reason`` carries both (``Parsed.why``: "not_found: options echoed").

How an answer is read, in one place:

1. **The answer's text.** Thinking is removed first: ``<think>...</think>``, ``<thinking>...</thinking>``,
   ``<reasoning>...</reasoning>``, everything before a closing tag whose opening tag was in the prompt, and an
   unclosed leading ``<think>`` block (then the answer never came: ``empty``). A JSON object with an answer field
   (``answer``, ``final_answer``, ``choice``, ``label``, ``intent``, ``rating``, ``score``, ``verdict``...) is read as
   that field; a LaTeX ``\\boxed{...}`` as its content (``\\text{}`` unwrapped). Characters are normalised (NFKC, so
   full-width "Ｃ" is "C"; curly quotes), and Chinese or Japanese text is split from Latin letters ("答案是C").
2. **An explicit final-answer statement wins.** "Answer: C", "Final answer: C", "The correct option is (C).",
   "the intent is card_arrival", "Rating: 6", "La réponse est C", "Die Antwort ist B", "La respuesta correcta es D",
   "答案是C", "答案应该是B", "正确答案：B", "故选B", "所以选B", "答えはB", "正解はB". A final one ("final answer"),
   a JSON key, or a line that starts with "Answer:" is strong, and the last strong one counts; else the last of the
   others ("... the answer is D"). Lenient reading also takes "I'd go with C", "I choose C", "我选B", "classified as
   X", and for ratings "I'd give it 6". An adverb between the marker and the answer does not stop it ("the answer
   is clearly C", "is, of course, C"); nor does a hedge on one answer ("the answer is most likely B" is B: the
   model names one), but a hedge across two is two ("is maybe B, maybe C", "is B or possibly C", "is B/C":
   ``ambiguous``). What follows the marker must be the answer itself: "the answer is not A" states nothing, and
   "No option is correct" or "Which answer is right?" is no marker.
3. **Otherwise the last sentence.** Letters (or option texts, labels, numbers) that are ruled out ("not A",
   "A is wrong", "A: wrong", "rule out A", "neither A nor B", "不是A", "A和B都不对", "Aは間違い") or only weighed
   ("A or C?", "between B and D") or not letters at all (a letter inside a word, the article "A" before a lowercase
   word, the pronoun "I") do not count; of the rest, the last sentence naming any decides, and names several:
   ``ambiguous``. A negation covers a list ("isn't A, B or C, so D" is D; "A, B and C are wrong"; "C, D are
   invalid") but a comma alone makes none ("Not A, B is right" is B), and it ends with its clause: at punctuation
   or a dash ("not B - C" is C).

Letters (:func:`parse_letter`):

* ``strict`` accepts only an unambiguous explicit letter: the whole answer is one letter ("B", "(b)", "**C**",
  "Answer: D", ``\\boxed{C}``, ``{"answer": "C"}``) in either case, or an explicit final-answer statement naming a
  letter ("... so the answer is C.", "La réponse est C"), or the none-of-them option's own text. "B. apple",
  "I think B", "I'd go with C", "B or C" are ``not_strict``.
* ``lenient`` (the default) also accepts, in this order after the whole-answer letter: the whole answer being one
  option's text ("apple"); a final-answer statement naming a letter or an option's text ("The answer is A cake");
  a leading letter label ("B. apple", "C, not A"; not one ruled out or in a list: "(C) and (D) are wrong, so B" is
  B, "A, C" is ``ambiguous``); none of them; then the last sentence's letters, then its option texts (whole words,
  an option inside a longer named one not counted).
  A lowercase letter counts only as the whole answer or right after a marker at the end of a statement ("answer:
  c"): "i think b" is no answer. A letter label that is not offered ("D. Rick" with A-C) is never taken: the
  answer is ``out_of_range`` unless an option's text decides. Known limit: "C. Rick" (a real letter with
  invented text) counts as C.
* An echoed option list states no choice: lines that start with the options' labels ("A. carrot\nB. apple", "(A)
  carrot", a markdown table's rows, a per-option analysis), or labelled options in a row ("The options are A)
  carrot, B) apple"), are no answer (``not_found``, "options echoed"), unless a line says its option is right
  ("B: correct"; two such lines: ``ambiguous``) or a choice is stated after the list ("... D. onion\n\nB").
* None of them: when the last option is the none-of-them marker (or an option such as "None of the above"),
  "None of the above", "none of the options", "none-of-them", "neither option is correct", "the answer is not
  listed", "it isn't among the choices", "all the options are wrong"... choose it. Without such an option these
  answers are invalid (``none_of_them``), even if letters follow ("None of A, B or C fits"). The same holds for
  labels ("None of the intents fit", "the correct label is not listed").
* Refusals ("I cannot answer", "As an AI ...", "I'm sorry", "I don't know") are invalid (``refusal``) unless the
  answer also states an explicit answer ("I'm sorry, but the answer is B").

Yes/no (:func:`parse_yes_no`): case-insensitive whole words, so "Not", "None", "Nobody" hold no "no", and
"Incorrectly" is no answer word. A negator (not, never, n't, cannot, neither, nor) up to three words before an
answer word in the same clause (a dash ends it) flips it ("isn't acceptable" is negative, "not incorrect" positive,
"neither correct nor acceptable" negative, "not bad - correct" positive). "no" before a noun is a determiner ("no
issues, it is acceptable" is positive), unless the next word starts a clause ("No it isn't"). A hedge naming both
sides ("yes or no", "yes and no", "correct or incorrect") or neither ("neither yes nor no") is ``ambiguous``. Order:
the whole answer, a final-answer statement, a hedge, the first word(s) (also oui/non, ja/nein, sí/no, yep/nope, yup,
yeah, nah, uh-huh/uh-uh, 是/是的/对/没错 and 否/不/不是/不对/没有, はい/ええ/うん and いいえ/ううん/違います), a
none-of-them statement that names the options ("None of the options is correct", "not listed": ``none_of_them``,
but not "none of them clash"), then all answer words outside questions ("Correct or incorrect? I'd say
incorrect."): if they disagree the negative wins (the reference checks its negative words first),
``conflict="first"`` takes the first, ``conflict="invalid"`` refuses. "Absolutely not" and "Not really" are
negative.

Scale (:func:`parse_scale`): the scale itself is no rating ("on a scale of 0 to 10", "out of 10", "/10", "with 10
being fully logical"); "N/10" and "N out of 10" are, and so is a number alone on the first line; a hedge between two
ratings ("7 or 8", "between 7 and 8") is ``ambiguous``.

Labels (:func:`parse_label`): British and American spellings are the same word ("recognised"/"recognized",
"cancelled"/"canceled", "colour"/"color", "cheque"/"check"), case, spaces, hyphens and underscores equivalent; a
label alone on the first line is the answer, its explanation after it is not read; "the intent is X or Y" is
``ambiguous``.

The NewTerm reference rules are reproduced apart, in :func:`newterm_reference_letter` and
:func:`newterm_reference_yes_no`, for the ``newterm-reference`` scoring mode.

This module is the parsers' public face and :func:`parse_answer`, the one entry point the engine calls; each rule
above is written once in ``runner/evaluate/parsers/``: the answer's text and words (``text.py``), reading it word
by word (``reader.py``), final-answer statements (``statements.py``), refusals and none-of-them (``refusals.py``),
then one module per parser (``letters.py``, ``yes_no.py``, ``scale.py``, ``labels.py``, ``reference.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from runner.evaluate.parsers.labels import parse_label
from runner.evaluate.parsers.letters import parse_letter, parse_letters
from runner.evaluate.parsers.parsed import Parsed, Reason
from runner.evaluate.parsers.reference import newterm_reference_letter, newterm_reference_yes_no
from runner.evaluate.parsers.refusals import is_none_of_them, is_refusal
from runner.evaluate.parsers.scale import parse_scale
from runner.evaluate.parsers.text import answer_text
from runner.evaluate.parsers.yes_no import YES_NO_FAMILIES, parse_yes_no
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
        answer = answer_text(text)
        if is_none_of_them(answer, marker):
            return Parsed(True)
        return Parsed(None, Reason.REFUSAL) if is_refusal(answer) else Parsed(False)
    raise ValueError(f"unknown parser {kind!r}")

