"""Seeded option permutations for multiple choice, and their inverse.

``perm[shown_position] = original_index``: the option shown as "A" is ``options[perm[0]]``. The permutation
depends only on the row id and the seed (not on the process, the platform or PYTHONHASHSEED), so a resumed
or repeated run shows the same order and hits the cache.
"""

from __future__ import annotations

import hashlib
import string

LETTERS = string.ascii_uppercase


def permutation(n: int, row_id: str, seed: int, shuffle: bool = True) -> list[int]:
    """A Fisher-Yates shuffle driven by a 256-bit BLAKE2b hash of (row id, seed): the same on every machine
    and Python version, and uniform up to about 57 options (57! < 2**256)."""
    order = list(range(n))
    if not shuffle:
        return order
    state = int.from_bytes(hashlib.blake2b(f"{row_id}\x1f{seed}".encode(), digest_size=32).digest(), "big")
    for i in range(n - 1, 0, -1):
        state, j = divmod(state, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def inverse(perm: list[int]) -> list[int]:
    """``inverse(perm)[original_index] = shown_position``."""
    out = [0] * len(perm)
    for shown, original in enumerate(perm):
        out[original] = shown
    return out


def options_block(options: list[str]) -> str:
    return "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))
