"""Seeded option permutations for multiple choice, and their inverse.

``perm[shown_position] = original_index``: the option shown as "A" is ``options[perm[0]]``. The permutation
depends only on the row id and the seed (not on the process, the platform or PYTHONHASHSEED), so a resumed
or repeated run shows the same order and hits the cache.
"""

from __future__ import annotations

import random
import string

LETTERS = string.ascii_uppercase


def permutation(n: int, row_id: str, seed: int, shuffle: bool = True) -> list[int]:
    order = list(range(n))
    if shuffle:
        # A str seed is hashed with SHA-512 by random.Random: stable across runs and machines.
        random.Random(f"{row_id}\x1f{seed}").shuffle(order)
    return order


def inverse(perm: list[int]) -> list[int]:
    """``inverse(perm)[original_index] = shown_position``."""
    out = [0] * len(perm)
    for shown, original in enumerate(perm):
        out[original] = shown
    return out


def options_block(options: list[str]) -> str:
    return "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))
