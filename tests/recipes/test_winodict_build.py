"""WinoDict construction: the committed key concepts, the ``winodict.items`` recipe and the build job."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner.recipes import Context, get_step
from runner.recipes import winodict as wd
from tests.helpers import ROOT, run_cli

DATA = ROOT / "data" / "winodict"
TAGS = {"VB", "VBD", "VBG", "VBN", "VBZ", "NN", "NNS", "JJ", "JJR", "RB", "RBR"}


def concepts() -> list[dict[str, Any]]:
    with open(DATA / "concepts.jsonl", encoding="utf-8") as lines:
        return [{**json.loads(line), "_id": json.loads(line)["id"]} for line in lines]


def build(rows: list[dict[str, Any]], seed: int = 0, **args: Any) -> list[dict[str, Any]]:
    return wd.items(rows, args, Context(similarity=None, seed=seed)).rows


@pytest.fixture(scope="module")
def all_items() -> list[dict[str, Any]]:
    return build(concepts())


# --- the committed concepts --------------------------------------------------------------------------------------


def test_concepts_shape_and_counts() -> None:
    rows = concepts()
    assert len(rows) == 184
    schemas: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        schemas.setdefault(row["schema"], []).append(row)
        assert row["sentence"][row["word_at"]:].startswith(row["word"])
        assert row["sentence"][row["pronoun_at"]:].startswith(row["pronoun"])
        assert row["tag"] in TAGS and row["pos"] == {"V": "VERB", "N": "NOUN", "J": "ADJ", "R": "ADV"}[row["tag"][0]]
        assert row["definition"] and not row["definition"].startswith("to ")
        assert row["answer"] == row["options"][row["label"]] and len(row["options"]) == 2
    assert len(schemas) == 92
    assert all(sorted(r["twin"] for r in twins) == [1, 2] for twins in schemas.values())
    assert all({r["label"] for r in twins} == {0, 1} for twins in schemas.values())  # the twins' answers flip
    by_pos = Counter(row["pos"] for row in rows)
    assert by_pos == {"ADJ": 73, "VERB": 69, "NOUN": 35, "ADV": 7}
    first = rows[0]
    assert (first["word"], first["lemma"], first["tag"], first["synset"]) == ("feared", "fear", "VBD", "fear.v.01")


def test_key_word_is_the_only_difference_between_twins() -> None:
    schemas: dict[int, dict[int, dict[str, Any]]] = {}
    for row in concepts():
        schemas.setdefault(row["schema"], {})[row["twin"]] = row
    for twins in schemas.values():
        one, two = twins[1], twins[2]
        assert one["word"] != two["word"]
        assert one["word_at"] == two["word_at"]
        assert one["sentence"][:one["word_at"]] == two["sentence"][:two["word_at"]]
        rest_one, rest_two = one["word_at"] + len(one["word"]), two["word_at"] + len(two["word"])
        assert one["sentence"][rest_one:] == two["sentence"][rest_two:]


def test_copied_files_are_the_authors_bytes() -> None:
    lines = (DATA / "original_words.tsv").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1609
    assert lines[2] == ("menth\t-11.042107762982315\tVB:menth,VBD:menthed,VBG:menthing,VBN:menthed,VBZ:menths,"
                        "JJ:menth,NN:menth,NNS:menths")
    assert len((DATA / "morph_rules.txt").read_text(encoding="utf-8").splitlines()) == 8


@pytest.mark.skipif(not Path("/usr/share/wordnet/index.noun").exists(), reason="needs Debian's wordnet-base")
@pytest.mark.skipif(not (ROOT.parent / "shared" / "seed-data" / "WSC").exists(), reason="needs the seed data")
def test_concepts_script_rebuilds_the_committed_files(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "winodict_concepts.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, check=True)
    assert "pairs kept: 92" in done.stdout
    for name in ("concepts.jsonl", "wordnet_known.txt", "original_words.tsv", "morph_rules.txt"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


# --- the recipe's parts ------------------------------------------------------------------------------------------


def test_inflection_uses_the_tags_column() -> None:
    # original_words.tsv: mande  VB:mande,VBD:manded,VBG:manding,VBN:manded,VBZ:mande,JJ:mand,NN:mand,NNS:mands
    word = wd.Word("mande", -11.29, {"VB": "mande", "VBD": "manded", "VBG": "manding", "VBN": "manded",
                                     "VBZ": "mande", "JJ": "mand", "NN": "mand", "NNS": "mands"})
    assert wd.inflect(word, "VBD") == ("manded", "mande")
    assert wd.inflect(word, "VBG") == ("manding", "mande")
    assert wd.inflect(word, "NNS") == ("mands", "mand")
    assert wd.inflect(word, "NN") == ("mand", "mand")
    assert wd.inflect(word, "JJ") == ("mand", "mand")
    assert wd.inflect(word, "RB") == ("mand", "mand")  # adverbs take the adjective, as the generator does
    assert wd.inflect(word, "JJR") == ("mander", "mand")
    assert [wd.comparative(a) for a in ("plesty", "sparne", "blat", "sparnelty")] == \
        ["plestier", "sparner", "blatter", "more sparnelty"]


def test_definition_sentences_per_part_of_speech() -> None:
    assert wd.definition_sentence("VERB", "plest", "be scared of") == "The verb to plest means to be scared of."
    assert wd.definition_sentence("NOUN", "plest", "a small dog") == "The word plest refers to a small dog."
    assert wd.definition_sentence("ADJ", "plest", "very tall") == "The meaning of plest is very tall."
    assert wd.definition_sentence("ADV", "plest", "quickly") == "The word plest means quickly."
    assert wd.definition_sentence("VERB", "plest", "run a business, etc.") == \
        "The verb to plest means to run a business, etc."
    assert wd.synonym_sentence("plest", "fear") == "The meaning of plest is similar to fear."


def test_options_read_as_the_pronoun_would() -> None:
    assert wd.fill("The demonstrators", "they", " feared violence.") == "the demonstrators"
    assert wd.fill("the trophy", "It", " is too large.") == "The trophy"
    assert wd.fill("Jim", "his", " empty glass.") == "Jim's"
    assert wd.fill("The barman", "his", " empty glass.") == "the barman's"
    assert wd.fill("Donna", "her", " concentration.") == "Donna's"
    assert wd.fill("Susan", "her", ".") == "Susan"


def test_buckets_follow_log_probability() -> None:
    assert [wd.bucket_of(x) for x in (-30.0, -29.9, -26.0, -25.9, -10.3, -10.0, -9.9)] == \
        [None, "prob1_of_5", "prob1_of_5", "prob2_of_5", "prob5_of_5", "prob5_of_5", None]


# --- the items ---------------------------------------------------------------------------------------------------


def test_recipe_is_registered() -> None:
    assert get_step("winodict.items") is wd.items


def test_items_per_bucket_and_their_words(all_items: list[dict[str, Any]]) -> None:
    # the original words twice: in the chosen form (definition_last) and without a definition (Table 2's Original)
    assert Counter((item["bucket"], item["strategy"]) for item in all_items) == {
        **{(bucket, "definition_last"): 184 for bucket in wd.BUCKETS}, ("unchanged", "none"): 184}
    words = wd.load_words(DATA / "original_words.tsv", DATA / "wordnet_known.txt")
    known = set((DATA / "wordnet_known.txt").read_text(encoding="utf-8").split())
    forms = {word.root: word for bucket in words.values() for word in bucket}
    for item in all_items:
        if item["bucket"] == "unchanged":
            assert item["word"] == item["original_word"] and item["fake_lemma"] == item["lemma"]
            continue
        assert wd.bucket_of(item["logprob"]) == item["bucket"]
        assert item["root"] not in known
        assert item["word"].lower() == wd.inflect(forms[item["root"]], item["tag"])[0]
        assert item["word"] in item["sentence"]
    by_schema: dict[tuple[int, str], set[str]] = {}
    for item in all_items:
        if item["bucket"] != "unchanged":
            by_schema.setdefault((item["schema"], item["bucket"]), set()).add(item["root"])
    assert all(len(roots) == 1 for roots in by_schema.values())  # both twins share the word


def test_same_seed_same_items_other_seed_other_words(all_items: list[dict[str, Any]]) -> None:
    rows = concepts()
    again = build(list(reversed(rows)))  # row order does not matter either
    assert sorted(again, key=lambda item: item["id"]) == sorted(all_items, key=lambda item: item["id"])
    other = {item["id"]: item["word"] for item in build(rows, seed=1)}
    changed = [item for item in all_items if item["bucket"] != "unchanged" and other[item["id"]] != item["word"]]
    assert len(changed) > 0.9 * 5 * 184


@pytest.mark.parametrize("strategy", wd.STRATEGIES)
def test_contexts_and_continuation_rebuild_the_sentence(strategy: str) -> None:
    items = build(concepts()[:40], strategy=strategy)
    assert {item["strategy"] for item in items} == {strategy, "none"}
    assert all(item["strategy"] == strategy or item["bucket"] == "unchanged" for item in items)
    for item in items:
        strategy = item["strategy"]
        before, after = item["sentence"].split("_")
        prefix, suffix = "", ""
        info = {"definition": item["definition_sentence"], "synonym": item["synonym_sentence"],
                "definition_synonym": f"{item['definition_sentence']} {item['synonym_sentence']}"}
        if strategy != "none":
            kind, place = strategy.rsplit("_", 1)
            prefix, suffix = (info[kind] + " ", "") if place == "first" else ("", " " + info[kind])
        assert item["continuation"] == after + suffix
        for context, option in zip(item["contexts"], item["options"], strict=True):
            assert context.startswith(prefix + before)
            filled = context[len(prefix + before):]
            assert filled.lower().removesuffix("'s").removesuffix("'") == option.lower()
        assert item["strategy"] == strategy


def test_examples_come_from_other_schemas(all_items: list[dict[str, Any]]) -> None:
    solved = {(item["bucket"], item["strategy"], item["contexts"][item["label"]] + item["continuation"]):
              item["schema"] for item in all_items}
    for item in all_items:
        assert len(item["examples"]) == 5 and len(set(item["examples"])) == 5
        for text in item["examples"]:  # of the same setting: no definition in the Original items' examples
            assert solved[(item["bucket"], item["strategy"], text)] != item["schema"]


def test_the_original_words_without_a_definition_are_their_own_items(all_items: list[dict[str, Any]]) -> None:
    """Table 2's Original is the original task: the original word, no definition anywhere in the scored text or its
    examples; the same twin with its definition as suffix is Table 3's Original / Def Suffix."""
    by_id = {item["id"]: item for item in all_items}
    plain = [item for item in all_items if item["strategy"] == "none"]
    assert len(plain) == 184 and all(item["id"].endswith("-unchanged-none") for item in plain)
    for item in plain:
        defined = by_id[item["id"].removesuffix("-none")]
        assert (defined["strategy"], defined["bucket"]) == ("definition_last", "unchanged")
        assert item["sentence"] == defined["sentence"] and item["word"] == item["original_word"]
        assert item["contexts"] == defined["contexts"]
        assert defined["continuation"] == item["continuation"] + " " + item["definition_sentence"]
        texts = [*item["contexts"], item["continuation"], *item["examples"]]
        assert not any("means to " in text or " refers to " in text or "The meaning of " in text for text in texts)
        # the same solved examples, each without the definition sentence its defined twin ends with
        for example, defined_example in zip(item["examples"], defined["examples"], strict=True):
            assert defined_example.startswith(example + " ") and len(defined_example) > len(example) + 10
    assert len(build(concepts()[:4], original_without_definition=False)) == 4 * len(wd.BUCKETS)
    assert len(build(concepts()[:4], strategy="none")) == 4 * len(wd.BUCKETS)  # already without one


def test_bad_arguments_fail_clearly() -> None:
    from runner.errors import RunnerError

    with pytest.raises(RunnerError, match="unknown bucket"):
        build(concepts()[:2], buckets=["prob9_of_5"])
    with pytest.raises(RunnerError, match="unknown strategy"):
        build(concepts()[:2], strategy="definition_middle")


# --- the job -----------------------------------------------------------------------------------------------------


def test_build_job_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(ROOT / "jobs" / "winodict-build.yaml"),
                             "--limit", "20", "--var", f"out={tmp_path / 'built'}", "--db", str(tmp_path / "db"))
    assert code == 0, err
    assert "140 items" in out
    with open(tmp_path / "built" / "winodict.jsonl", encoding="utf-8") as lines:
        items = [json.loads(line) for line in lines]
    assert len(items) == 140 and not any(key.startswith("_") for key in items[0])
    assert Counter(item["bucket"] for item in items) == {**{bucket: 20 for bucket in wd.BUCKETS}, "unchanged": 40}
    assert Counter(item["strategy"] for item in items) == {"definition_last": 120, "none": 20}
    assert items[0]["id"] == "0-1-prob1_of_5" and items[0]["continuation"].endswith(items[0]["definition_sentence"])
