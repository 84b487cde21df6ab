"""Label names (:func:`parse_label`): Bank-77 intents and other class labels, spelled any way a grader accepts."""

from __future__ import annotations

from collections.abc import Sequence

from runner.plan.choices import NONE_OF_THEM_MARKER

from .parsed import Parsed, Reason
from .reader import Reader, choose, name_mentions
from .refusals import is_none_of_them, is_refusal, marker_slot
from .statements import CHOSEN, stated_answer
from .text import answer_core, graded_text, same_text

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
    answer = graded_text(text)
    if answer is None:
        return Parsed(None, Reason.EMPTY)
    core = answer_core(answer)
    exact = [i for i, label in enumerate(labels) if label in (core, answer.strip())]
    if len(exact) == 1:
        return Parsed(exact[0])
    same = same_text(core, labels)
    if len(same) == 1:
        return Parsed(same[0])
    if len(same) > 1:
        return Parsed(None, Reason.AMBIGUOUS, "several labels match")
    r = Reader(answer)
    mentions = name_mentions(r, labels)

    def read_at(offset: int) -> Parsed | None:
        k = r.at(offset, _LABEL_LEAD_IN)
        named = {(b, i) for a, b, i in mentions if a == k}
        if len(named) != 1:
            return None
        end, index = named.pop()
        if end + 2 < len(r.words) and r.lower[end + 1] == "or" and any(a == end + 2 for a, _, _ in mentions):
            return Parsed(None, Reason.AMBIGUOUS, "two labels stated")  # "the intent is card_arrival or ..."
        return Parsed(index)

    stated = stated_answer(answer, read_at, CHOSEN)
    if stated is not None:
        return stated
    first_line = same_text(answer_core(answer.strip().splitlines()[0]), labels)
    if len(first_line) == 1:  # the label, then its explanation
        return Parsed(first_line[0])
    slot = marker_slot(labels, marker)
    if is_none_of_them(answer, marker):
        return Parsed(slot) if slot is not None else Parsed(None, Reason.NONE_OF_THEM, "no label offered for it")
    if is_refusal(answer):
        return Parsed(None, Reason.REFUSAL)
    found = choose(r, mentions)
    if found is not None:
        return found
    return Parsed(None, Reason.NOT_FOUND, "negated every label" if mentions else "no label named")
