"""runner.recipes.newterm on answers written the way chat models write them: exact items, exact rule counts."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from runner.plan.similarity import LexicalSimilarity
from runner.recipes import Context, get_parser, get_step, parser_names, step_names
from runner.recipes.newterm import contains_term, replace_term

SEED_DATA = Path("/work/shared/seed-data/NewTerm/benchmark_2023")


def parse(name: str, text: str, row: dict, args: dict | None = None):
    fn = get_parser(f"newterm.{name}")
    assert fn is not None
    return fn(text, row, args or {})


def run(name: str, rows: list[dict], args: dict, ctx: Context | None = None):
    fn = get_step(f"newterm.{name}")
    assert fn is not None
    return fn(rows, args, ctx or Context(similarity=LexicalSimilarity(), seed=0))


class TableSimilarity:
    """Similarities read from a table (unlisted pairs 0, a text with itself 1), so a test fixes the ranking."""

    name = "table"

    def __init__(self, pairs: dict[tuple[str, str], float]) -> None:
        self.pairs = {frozenset(k): v for k, v in pairs.items()}
        self.calls: list[tuple[list[str], list[str]]] = []

    def matrix(self, a: Sequence[str], b: Sequence[str]) -> list[list[float]]:
        self.calls.append((list(a), list(b)))
        return [[1.0 if x == y else self.pairs.get(frozenset((x, y)), 0.0) for y in b] for x in a]


def test_every_recipe_is_registered() -> None:
    assert {"newterm.related_lines", "newterm.coma_paragraphs", "newterm.term_sentences",
            "newterm.wrong_sentences"} <= set(parser_names())
    assert {"newterm.related_terms", "newterm.filter_choices", "newterm.cost_items",
            "newterm.finalize"} <= set(step_names())


# --- helpers ----------------------------------------------------------------------------------------------


def test_contains_term_is_whole_word_and_case_insensitive() -> None:
    assert contains_term("Deadheading is common among crews.", "deadheading")
    assert contains_term("They called it a boilover!", "Boilover")
    assert contains_term("the stochastic parrot's reply", "stochastic parrot")
    assert not contains_term("They were deadheading home.", "deadhead")
    assert not contains_term("a dead-head crew", "deadhead")
    assert not contains_term("a stochastic  parrot", "stochastic parrot")
    assert contains_term("a well-known term", "well-known")
    assert not contains_term("a well known term", "well-known")
    assert not contains_term("anything", "")


def test_replace_term_keeps_an_initial_capital() -> None:
    assert replace_term("Deadheading saves money; deadheading is free.", "deadheading", "free travel") == \
        "Free travel saves money; free travel is free."
    assert replace_term("The crew was DEADHEADING home.", "deadheading", "riding") == "The crew was Riding home."
    assert replace_term("The deadheads were deadheading.", "deadheading", "x") == "The deadheads were x."
    assert replace_term("No term here.", "deadheading", "x") == "No term here."
    assert replace_term("Use a stochastic parrot.", "Stochastic Parrot", "language model") == \
        "Use a language model."


# --- newterm.related_lines --------------------------------------------------------------------------------

PARTIAL_SYNONYMS = """\
1. Free ride
2. "Travel"
3. **Trip**
4. Go home for free
5) Ride without paying,
- Free ride
* Deadheading
• Empty travel; this is when a worker rides home without paying any fare
a) None
b) N/A
Note: these are simple
Travel free.

6. Work trip
"""


def test_related_lines_strips_markers_and_applies_the_rules_in_order() -> None:
    out = parse("related_lines", PARTIAL_SYNONYMS, {"term": "deadheading"})
    assert out.items == ["Free ride", "Travel", "Trip", "Go home for free", "Ride without paying", "Work trip"]
    assert out.rejected == Counter({
        "repeated": 1,                  # "- Free ride"
        "is the term itself": 1,        # "* Deadheading"
        "more than 5 words": 1,         # the explanation line (also has ";"... and more words: words win)
        "says none or n/a": 2,
        "contains ':'": 1,
        "contains '.'": 1,
    })


def test_related_lines_numbering_is_stripped_before_the_period_check() -> None:
    out = parse("related_lines", "1. happy\n2. happy. sad\n3. glad\n", {"term": "joyful"})
    assert out.items == ["happy", "glad"]
    assert out.rejected == Counter({"contains '.'": 1})


def test_related_lines_none_is_a_word_not_a_substring() -> None:
    out = parse("related_lines", "Nonetheless\nnone at all\nNONE\nCanon\n", {"term": "x"})
    assert out.items == ["Nonetheless", "Canon"]
    assert out.rejected == Counter({"says none or n/a": 2})


def test_related_lines_repeats_ignore_case_and_spacing() -> None:
    out = parse("related_lines", "Sudden win\nsudden  WIN\nUpset\n\n\n", {"term": "boilover"})
    assert out.items == ["Sudden win", "Upset"]
    assert out.rejected == Counter({"repeated": 1})


def test_related_lines_empty_answer() -> None:
    out = parse("related_lines", "\n  \n", {"term": "x"})
    assert out.items == [] and out.rejected == Counter()


# --- newterm.coma_paragraphs ------------------------------------------------------------------------------

COMA_EFFECT = """\
1. The airline scheduled deadheading for three pilots to Denver. As an effect, the morning flight left on time.
2. **Paragraph 2:** Deadheading crews filled the last row of seats. As an effect the paying passengers were moved.
Paragraph 3:
"The union negotiated pay for deadheading hours. As an effect, crews were paid while travelling to their bases."
4. The crew rode to Chicago. As an effect, the evening flight had a full crew.
5. The airline scheduled deadheading for three pilots to Denver. As an effect, the morning flight left on time.
6. Deadheading was banned on short routes. This happened because: crews complained about long days.
7. Deadheading staff wore their uniforms on board.
8. Deadheading staff travelled. As an effect,
"""


def test_coma_effect_paragraphs() -> None:
    out = parse("coma_paragraphs", COMA_EFFECT, {"term": "deadheading", "split": "effect"})
    assert out.items == [
        {"question": "The airline scheduled deadheading for three pilots to Denver.",
         "answer": "the morning flight left on time."},
        {"question": "Deadheading crews filled the last row of seats.",
         "answer": "the paying passengers were moved."},
        {"question": "The union negotiated pay for deadheading hours.",
         "answer": "crews were paid while travelling to their bases."},
    ]
    assert out.rejected == Counter({
        "term missing from sentence 1": 1,
        "repeated": 1,
        "wrong connector": 1,
        "no connector": 1,
        "empty sentence": 1,
    })


def test_coma_cause_paragraphs_accept_the_connector_without_its_colon() -> None:
    answer = (
        "Paragraph 1: Fans called the final a boilover. This happened because: the last-seeded team won.\n"
        "Paragraph 2: The bookmakers lost millions on the boilover. this happened because the favourite fell.\n"
        "Paragraph 3: The boilover stunned the crowd. As an effect, nobody cheered.\n"
    )
    out = parse("coma_paragraphs", answer, {"term": "boilover", "split": "cause"})
    assert out.items == [
        {"question": "Fans called the final a boilover.", "answer": "the last-seeded team won."},
        {"question": "The bookmakers lost millions on the boilover.", "answer": "the favourite fell."},
    ]
    assert out.rejected == Counter({"wrong connector": 1})


# --- newterm.term_sentences -------------------------------------------------------------------------------

COST_SENTENCES = """\
Here are three sentences:
1. Through deadheading, flight attendants can move between bases without paying.
2. The pilots were deadheading to Denver after the storm.
3. Deadheading helps.
4. through deadheading, flight attendants can move between bases without paying.
5. Airlines budget for dead-heading every month.
- "Deadheading crews often sit in the last row."
"""


def test_term_sentences_for_the_term() -> None:
    out = parse("term_sentences", COST_SENTENCES, {"term": "deadheading"})
    assert out.items == [
        "Through deadheading, flight attendants can move between bases without paying.",
        "The pilots were deadheading to Denver after the storm.",
        "Deadheading crews often sit in the last row.",
    ]
    assert out.rejected == Counter({"does not contain the term": 2, "fewer than 4 words": 1, "repeated": 1})


def test_term_sentences_for_another_field() -> None:
    answer = "The free ride home was a perk of the job.\nA free-ride policy saved the crew money.\n"
    out = parse("term_sentences", answer, {"term": "deadheading", "answer_term": "free ride"},
                {"field": "answer_term"})
    assert out.items == ["The free ride home was a perk of the job."]
    assert out.rejected == Counter({"does not contain the term": 1})


# --- newterm.wrong_sentences ------------------------------------------------------------------------------

CSJ_WRONG = """\
Sure! Here are the modified sentences:

1. **Wrong Sentence:** The chef used deadheading to season the soup.
   **Corresponding Wrong meaning:** Deadheading is treated as a spice.

2. Wrong Sentence:
"Deadheading painted the fence blue."
Corresponding wrong meaning: Deadheading is a person who paints.

3. Wrong Sentence: The pilot deadheaded the engine to start it.
Corresponding Wrong meaning: A way of starting engines.

4. Wrong Sentence 4: The chef used deadheading to season the soup.
Corresponding Wrong Meaning: A spice again.

5. Wrong Sentence: Deadheading grew tall in the garden.
6. Wrong Sentence: The river was deadheading toward the sea.
Corresponding Wrong meaning:
The river is said to travel for free.
"""


def test_wrong_sentences_pairs() -> None:
    out = parse("wrong_sentences", CSJ_WRONG, {"term": "deadheading"})
    assert out.items == [
        {"sentence": "The chef used deadheading to season the soup.",
         "wrong_meaning": "Deadheading is treated as a spice."},
        {"sentence": "Deadheading painted the fence blue.", "wrong_meaning": "Deadheading is a person who paints."},
        {"sentence": "The river was deadheading toward the sea.",
         "wrong_meaning": "The river is said to travel for free."},
    ]
    assert out.rejected == Counter({"does not contain the term": 1, "repeated": 1, "no wrong meaning": 1})


def test_wrong_sentences_a_last_sentence_without_meaning() -> None:
    answer = "Wrong Sentence: Deadheading barked at the mailman.\n"
    out = parse("wrong_sentences", answer, {"term": "deadheading"})
    assert out.items == [] and out.rejected == Counter({"no wrong meaning": 1})


def test_wrong_sentences_without_any_label() -> None:
    answer = "1. The chef used deadheading to season the soup.\n2. Deadheading painted the fence.\n"
    out = parse("wrong_sentences", answer, {"term": "deadheading"})
    assert out.items == [] and out.rejected == Counter({"no 'Wrong Sentence:' lines": 1})


# --- newterm.related_terms --------------------------------------------------------------------------------


def test_related_terms_greedy_dedup_drops_the_lower_priority_member() -> None:
    row = {"_id": "r1", "term": "boilover",
           "partial": ["Upset", "Surprise", "Overflow", "Sudden win", "Shock result", "Boil"],
           "synonyms": ["upset", "Shock defeat", "Boilover"],
           "antonyms": ["Predictable result"],
           "guesses": ["Boiling over"]}
    similarity = TableSimilarity({
        ("Boil", "Boiling over"): 0.9,      # guesses lose to partial synonyms
        ("Shock result", "Shock defeat"): 0.8,
        ("Overflow", "Boiling over"): 0.7,  # "Boiling over" is gone by then
        ("Upset", "Surprise"): 0.6,
        ("Sudden win", "Predictable result"): 0.5,
    })
    fields = ["partial", "synonyms", "antonyms", "guesses"]
    out = run("related_terms", [row], {"fields": fields, "count": 5}, Context(similarity=similarity))
    assert out.dropped == Counter()
    # candidates: Upset Surprise Overflow "Sudden win" "Shock result" Boil "Shock defeat" "Predictable result"
    # "Boiling over" (9); drops: Boiling over, Shock defeat, Surprise, Predictable result
    assert out.rows == [{**row, "related": ["Upset", "Overflow", "Sudden win", "Shock result", "Boil"]}]
    assert similarity.calls[0][0] == ["Upset", "Surprise", "Overflow", "Sudden win", "Shock result", "Boil",
                                      "Shock defeat", "Predictable result", "Boiling over"]


def test_related_terms_too_few_and_missing_fields() -> None:
    rows = [
        {"_id": "a", "term": "chargeless", "synonyms": ["Exempt", "exempt", "Chargeless", "Free"],
         "antonyms": ["Charged"]},
        {"_id": "b", "term": "ageless", "synonyms": ["Timeless", "Eternal"], "antonyms": ["Mortal", "Old"],
         "guesses": ["Age-free"]},
    ]
    out = run("related_terms", rows, {"fields": ["synonyms", "antonyms", "guesses"], "count": 5})
    assert out.dropped == Counter({"fewer than 5 distinct related terms": 1})
    assert [r["_id"] for r in out.rows] == ["b"]
    assert out.rows[0]["related"] == ["Timeless", "Eternal", "Mortal", "Old", "Age-free"]

    out = run("related_terms", rows[:1], {"fields": ["synonyms", "antonyms"], "count": 3})
    assert out.rows[0]["related"] == ["Exempt", "Free", "Charged"] and out.dropped == Counter()


def test_related_terms_with_the_lexical_backend() -> None:
    row = {"term": "deadheading", "partial": ["Free ride", "Free rides", "Work trip", "Go home", "Plane"],
           "guesses": ["Dead end", "Head start"]}
    out = run("related_terms", [row], {"fields": ["partial", "guesses"]})
    # "Free ride"/"Free rides" share a word and most trigrams (0.76), "Dead end"/"Head start" one trigram (0.2)
    assert out.rows[0]["related"] == ["Free ride", "Work trip", "Go home", "Plane", "Dead end"]


def test_related_terms_picks_the_two_most_distinct_for_the_second_half_of_cost() -> None:
    """Run on the five related terms with ``count: 2`` and ``as:``, the step picks the pair the released code's
    ``filter_sim(line["phrases"].copy(), MAXIMUM, model)`` keeps (MAXIMUM = 2, hexuandeng/NewTerm 1acc3f0,
    newterm/3_COST_generation.py), leaving ``related`` as it was."""
    related = ["Upset", "Surprise", "Overflow", "Sudden win", "Shock result"]
    row = {"_id": "r1", "term": "boilover", "related": related}
    similarity = TableSimilarity({("Upset", "Surprise"): 0.9, ("Upset", "Shock result"): 0.8,
                                  ("Overflow", "Sudden win"): 0.7, ("Upset", "Sudden win"): 0.6})
    out = run("related_terms", [row], {"fields": ["related"], "count": 2, "as": "cost_answers"},
              Context(similarity=similarity))
    # drops Surprise (0.9), Shock result (0.8), Sudden win (0.7): Upset and Overflow are left
    assert out.rows == [{**row, "cost_answers": ["Upset", "Overflow"]}] and out.rows[0]["related"] == related


# --- newterm.filter_choices -------------------------------------------------------------------------------

COMA_OPTIONS = [
    "the morning flight left on time.",      # 0 gold
    "the pilots were paid overtime.",        # 1
    "the passengers were delighted.",        # 2
    "the morning flight was on schedule.",   # 3
    "the plane was repainted.",              # 4
    "the airport closed early.",             # 5
]


def filter_row(selected: list[int] | None, **extra) -> dict:
    return {"_id": "q1", "term": "deadheading", "question": "The airline scheduled deadheading.",
            "options": COMA_OPTIONS, "gold": 0, "selected": selected, **extra}


def test_filter_choices_removes_plausible_then_the_closest_to_gold() -> None:
    similarity = TableSimilarity({(COMA_OPTIONS[0], COMA_OPTIONS[3]): 0.9,
                                  (COMA_OPTIONS[0], COMA_OPTIONS[4]): 0.2})
    out = run("filter_choices", [filter_row([0, 2])], {"keep": 4}, Context(similarity=similarity))
    assert out.dropped == Counter()
    assert out.rows == [{"_id": "q1", "term": "deadheading", "question": "The airline scheduled deadheading.",
                         "choices": [COMA_OPTIONS[0], COMA_OPTIONS[1], COMA_OPTIONS[4], COMA_OPTIONS[5]],
                         "gold": 0, "dropped_as_plausible": 1}]
    assert similarity.calls == [([COMA_OPTIONS[0]], [COMA_OPTIONS[1], COMA_OPTIONS[3], COMA_OPTIONS[4],
                                                      COMA_OPTIONS[5]])]


def test_filter_choices_gold_index_follows_the_kept_order() -> None:
    row = {**filter_row([3]), "gold": 3}
    out = run("filter_choices", [row], {"keep": 4}, Context(similarity=TableSimilarity({
        (COMA_OPTIONS[3], COMA_OPTIONS[0]): 0.9, (COMA_OPTIONS[3], COMA_OPTIONS[5]): 0.5})))
    assert out.rows[0]["choices"] == [COMA_OPTIONS[1], COMA_OPTIONS[2], COMA_OPTIONS[3], COMA_OPTIONS[4]]
    assert out.rows[0]["gold"] == 2 and out.rows[0]["dropped_as_plausible"] == 0


def test_filter_choices_rules() -> None:
    rows = [
        filter_row(None),
        filter_row([1, 2]),
        filter_row([0, 1, 2, 3]),
        filter_row([0, 1, 2]),
    ]
    out = run("filter_choices", rows, {"keep": 4})
    assert out.dropped == Counter({"filter answer unreadable": 1, "filter did not choose the correct answer": 1,
                                   "fewer than 4 options left": 1})
    assert out.rows[0]["choices"] == [COMA_OPTIONS[0], COMA_OPTIONS[3], COMA_OPTIONS[4], COMA_OPTIONS[5]]
    assert out.rows[0]["dropped_as_plausible"] == 2


def test_filter_choices_protects_the_term() -> None:
    options = ["deadheading", "Free ride", "Work trip", "Go home", "Plane", "Dead weight"]
    base = {"term": "deadheading", "options": options}
    rows = [
        {**base, "_id": "gold-is-related", "gold": 2, "selected": [2, 0]},
        {**base, "_id": "term-is-gold", "gold": 0, "selected": [0]},
        {**base, "_id": "term-kept", "gold": 3, "selected": [3, 4]},
    ]
    # the term is the option closest to "Go home", yet it stays where it is protected
    similarity = TableSimilarity({("Go home", "deadheading"): 0.99, ("Go home", "Work trip"): 0.5,
                                  ("deadheading", "Dead weight"): 0.8})
    out = run("filter_choices", rows, {"keep": 4, "protect": "term"}, Context(similarity=similarity))
    assert out.dropped == Counter({"the term was judged plausible": 1})
    by_id = {row["_id"]: row for row in out.rows}
    assert by_id["term-is-gold"]["choices"] == ["deadheading", "Free ride", "Work trip", "Plane"]
    assert by_id["term-is-gold"]["gold"] == 0
    assert by_id["term-kept"]["choices"] == ["deadheading", "Free ride", "Go home", "Dead weight"]
    assert by_id["term-kept"]["gold"] == 2 and by_id["term-kept"]["dropped_as_plausible"] == 1


# --- newterm.cost_items -----------------------------------------------------------------------------------


def cost_row(sentence: str, answer: str, **extra) -> dict:
    return {"_id": sentence[:12], "term": "deadheading", "related": ["Go home", "Plane", "Work trip", "go home",
                                                                      "Free ride", "Deadheading"],
            "sentence": sentence, "answer_term": answer, **extra}


def test_cost_items_blank_the_answer() -> None:
    rows = [
        cost_row("Through deadheading, flight attendants can move between bases.", "deadheading"),
        cost_row("Deadheading is common on the first flight of the day.", "deadheading"),
        cost_row("The long work trip ended in Paris.", "work trip"),
    ]
    out = run("cost_items", rows, {})
    options = ["deadheading", "Go home", "Plane", "Work trip", "Free ride"]
    assert [(r["question"], r["options"], r["gold"]) for r in out.rows] == [
        ("Through _, flight attendants can move between bases.", options, 0),
        ("_ is common on the first flight of the day.", options, 0),
        ("The long _ ended in Paris.", options, 3),
    ]
    assert out.rows[0]["_id"] == rows[0]["_id"] and out.rows[0]["sentence"] == rows[0]["sentence"]
    assert out.dropped == Counter()


def test_cost_items_rules() -> None:
    rows = [
        cost_row("The crew were deadheaded home.", "deadheading"),
        cost_row("A plane is a plane.", "Plane"),
        cost_row("The free lunch was welcome.", "free lunch"),
    ]
    out = run("cost_items", rows, {})
    assert out.rows == []
    assert out.dropped == Counter({"sentence lacks its answer": 1, "answer appears more than once": 1,
                                   "answer is not an option": 1})


# --- newterm.finalize -------------------------------------------------------------------------------------


def coma_final_row(question: str) -> dict:
    return {"_id": question[:8], "_stage": "filter", "term": "deadheading", "meaning": "travelling free",
            "type": "new words not deduced", "question": question, "split": "effect",
            "choices": ["gold answer", "wrong one", "wrong two", "wrong three"], "gold": 0,
            "dropped_as_plausible": 2, "related": ["x"]}


def test_finalize_coma_shuffles_with_the_seed_and_records_it() -> None:
    rows = [coma_final_row(f"The airline scheduled deadheading number {i}.") for i in range(20)]
    out = run("finalize", rows, {"task": "COMA", "seed": 7})
    assert out.dropped == Counter()
    for before, after in zip(rows, out.rows, strict=True):
        assert set(after) == {"_id", "_stage", "term", "meaning", "type", "question", "split", "choices", "gold",
                              "_shuffle", "_shuffle_seed"}
        assert after["_id"] == before["_id"] and after["_stage"] == "filter" and after["_shuffle_seed"] == 7
        assert sorted(after["_shuffle"]) == [0, 1, 2, 3]
        assert after["choices"] == [before["choices"][i] for i in after["_shuffle"]]
        assert after["choices"][after["gold"]] == "gold answer"
    assert len({after["gold"] for after in out.rows}) > 1
    again = run("finalize", list(reversed(rows)), {"task": "COMA", "seed": 7})
    assert list(reversed(again.rows)) == out.rows
    other = run("finalize", rows, {"task": "COMA"}, Context(similarity=None, seed=8))
    assert other.rows[0]["_shuffle_seed"] == 8
    assert [r["_shuffle"] for r in other.rows] != [r["_shuffle"] for r in out.rows]


def test_finalize_cost_and_csj_schemas() -> None:
    cost = {**coma_final_row("Through _, crews move."), "_id": "c"}
    del cost["split"]
    csj = {"_id": "j", "term": "boilover", "meaning": "an upset", "type": "new words not deduced",
           "question": "The final ended in a boilover.", "gold": 1, "score": 9}
    out_cost = run("finalize", [cost], {"task": "COST", "seed": 0})
    assert set(out_cost.rows[0]) == {"_id", "_stage", "term", "meaning", "type", "question", "choices", "gold",
                                     "_shuffle", "_shuffle_seed"}
    out_csj = run("finalize", [csj], {"task": "CSJ"})
    assert out_csj.rows == [{"_id": "j", "term": "boilover", "meaning": "an upset", "type": "new words not deduced",
                             "question": "The final ended in a boilover.", "gold": True}]


def test_finalize_missing_field() -> None:
    row = coma_final_row("The airline scheduled deadheading.")
    del row["meaning"]
    out = run("finalize", [row, {**row, "meaning": "m"}], {"task": "COMA", "seed": 0})
    assert out.dropped == Counter({"missing field": 1}) and len(out.rows) == 1


# --- the released COST file -------------------------------------------------------------------------------


@pytest.mark.skipif(not (SEED_DATA / "COST_clean.jsonl").exists(), reason="NewTerm seed data not present")
def test_released_cost_rows_round_trip_through_cost_items() -> None:
    """Put each released question's gold back into its blank: cost_items must recover the same question,
    with the gold among the options, for the released file's first 20 rows."""
    lines = (SEED_DATA / "COST_clean.jsonl").read_text(encoding="utf-8").splitlines()[:20]
    released = [json.loads(line) for line in lines]
    rows = [_unblanked(item) for item in released]
    out = run("cost_items", rows, {})
    assert out.dropped == Counter()
    for item, row in zip(released, out.rows, strict=True):
        assert row["question"] == item["question"]
        assert row["options"][row["gold"]].lower() == item["choices"][item["gold"]].lower()


def _unblanked(item: dict) -> dict:
    """A cost_items input row rebuilt from a released item: its gold written into the blank (capitalised
    only at a sentence start), the other choices as related terms."""
    answer = item["choices"][item["gold"]]
    filler = answer if item["question"].startswith("_") else answer[:1].lower() + answer[1:]
    related = [choice for choice in item["choices"] if choice.lower() != item["term"].lower()]
    return {"_id": item["term"], "term": item["term"], "related": related,
            "sentence": item["question"].replace("_", filler, 1), "answer_term": answer}
