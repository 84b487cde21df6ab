"""Seeded option permutations for multiple choice, their inverse, and the none-of-them slot.

``perm[shown_position] = original_index``: the option shown as "A" is ``options[perm[0]]``. The permutation
depends only on the row id and the seed (not on the process, the platform or PYTHONHASHSEED), so a resumed
or repeated run shows the same order and hits the cache.

Know-No's prompts without the gold option (``drop_option``) show the other options, shuffled; the hint-as-option
style then appends the "none-of-them" marker as the fixed last option (``append_none_of_them``). The marker's
slot records :data:`NONE_OF_THEM` (-1) as its original index, so ``perm[parsed_shown_position]`` is either an
original option index or :data:`NONE_OF_THEM`; a without-gold item is answered right when it is the latter.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence

__all__ = [
    "LETTERS",
    "NONE_OF_THEM",
    "NONE_OF_THEM_MARKER",
    "append_none_of_them",
    "drop_option",
    "inverse",
    "inverse_partial",
    "options_block",
    "permutation",
    "shown_position",
]

LETTERS = string.ascii_uppercase

#: the original index recorded for the none-of-them slot (it is no option of the item)
NONE_OF_THEM = -1
#: Know-No's label for that slot, shown as the last option or named in the instruction
NONE_OF_THEM_MARKER = "none-of-them"


def permutation(n: int, row_id: str, seed: int, shuffle: bool = True) -> list[int]:
    """A Fisher-Yates shuffle driven by a BLAKE2b hash of (row id, seed): the same on every machine and Python
    version. Its 256 bits make every order of up to 57 options reachable (57! < 2**256); more options (Bank-77's
    77 intents) draw from a longer state, extended by further hashes, so every swap of the shuffle is random."""
    order = list(range(n))
    if not shuffle:
        return order
    key = f"{row_id}\x1f{seed}".encode()
    state = int.from_bytes(hashlib.blake2b(key, digest_size=32).digest(), "big")
    if n > 57:  # n! needs more than 256 bits: 64 more bits than log2(n!) keep every draw's bias below 2**-64
        bits = 256
        needed = sum(i.bit_length() for i in range(2, n + 1)) + 64
        block = 0
        while bits < needed:
            block += 1
            more = hashlib.blake2b(key + b"\x1f" + str(block).encode(), digest_size=64).digest()
            state = (state << 512) | int.from_bytes(more, "big")
            bits += 512
    for i in range(n - 1, 0, -1):
        state, j = divmod(state, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def inverse(perm: list[int]) -> list[int]:
    """``inverse(perm)[original_index] = shown_position``, for a permutation of ``range(len(perm))``.

    Raises ``ValueError`` for anything else (a dropped option, the none-of-them slot): use
    :func:`inverse_partial` there, instead of getting a silently wrong mapping."""
    out = [-1] * len(perm)
    for shown, original in enumerate(perm):
        if not 0 <= original < len(perm) or out[original] != -1:
            raise ValueError(f"not a permutation of 0..{len(perm) - 1}: {perm}; use inverse_partial()")
        out[original] = shown
    return out


def inverse_partial(perm: Sequence[int], n: int | None = None) -> list[int | None]:
    """``[original_index] -> shown_position`` over ``n`` original options, ``None`` for an option not shown
    (the dropped gold); the none-of-them slot (:data:`NONE_OF_THEM`) has no original index and is skipped.

    ``n`` defaults to the largest original index shown plus one: pass it when the dropped option may be the
    last one."""
    shown_originals = [original for original in perm if original != NONE_OF_THEM]
    size = n if n is not None else max(shown_originals, default=-1) + 1
    out: list[int | None] = [None] * size
    for shown, original in enumerate(perm):
        if original == NONE_OF_THEM:
            continue
        if not 0 <= original < size or out[original] is not None:
            raise ValueError(f"original index {original} out of range or repeated in {list(perm)}")
        out[original] = shown
    return out


def shown_position(perm: Sequence[int], original: int) -> int | None:
    """Where the option with this original index (or :data:`NONE_OF_THEM`) is shown, or ``None``."""
    try:
        return list(perm).index(original)
    except ValueError:
        return None


def drop_option(
    options: Sequence[str], drop: int, row_id: str, seed: int, shuffle: bool = True
) -> tuple[list[str], list[int], list[int | None]]:
    """Remove option ``drop`` (the gold, for Know-No's prompts without it), then shuffle the others.

    Returns the shown options, ``perm`` (``perm[shown] = original index``, relative to the ORIGINAL options)
    and its inverse over the original options (``None`` at ``drop``). The shuffle is
    ``permutation(len(options) - 1, row_id, seed, shuffle)`` applied to the remaining options in their
    original order, so it is as deterministic as :func:`permutation`."""
    if not 0 <= drop < len(options):
        raise ValueError(f"cannot drop option {drop} of {len(options)}")
    rest = [i for i in range(len(options)) if i != drop]
    perm = [rest[j] for j in permutation(len(rest), row_id, seed, shuffle)]
    return [options[i] for i in perm], perm, inverse_partial(perm, len(options))


def append_none_of_them(
    shown: Sequence[str], perm: Sequence[int], marker: str = NONE_OF_THEM_MARKER
) -> tuple[list[str], list[int]]:
    """The shown options with ``marker`` as the fixed last option (after any shuffle), and ``perm`` with
    :data:`NONE_OF_THEM` for that slot. Its letter is ``LETTERS[len(shown)]``."""
    if len(shown) != len(perm):
        raise ValueError(f"{len(shown)} options shown but the permutation has {len(perm)} entries")
    return [*shown, marker], [*perm, NONE_OF_THEM]


def options_block(options: list[str]) -> str:
    return "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(options))
