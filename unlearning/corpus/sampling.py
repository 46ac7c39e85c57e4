"""Seeded, streaming samples of a corpus: every record has a rank, a sample is the lowest ranks.

`rank(position, seed)` is splitmix64 (Steele et al. 2014) of the record's position mixed
with the seed: a bijection on 64-bit integers, so ranks never tie, and a record's rank is
known without reading any other record.  "The n records of lowest rank" is therefore the
same set whether it is computed over a loaded corpus, a stream, or shards read in
parallel, and a stream finds it by keeping only the records under a rank threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from unlearning.corpus.records import Record

MASK = (1 << 64) - 1
RANK_SPACE = 1 << 64
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _mix(z: int) -> int:
    z = (z + _GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * _M1) & MASK
    z = ((z ^ (z >> 27)) * _M2) & MASK
    return z ^ (z >> 31)


def seed_key(seed: int) -> int:
    return _mix(seed & MASK)


def rank(position: int, seed: int) -> int:
    """The record at `position`'s rank for `seed` (lower is sampled first)."""
    return _mix(position ^ seed_key(seed))


def ranks(positions: np.ndarray, seed: int) -> np.ndarray:
    """`rank` of many positions at once (uint64 arithmetic wraps, as the mix needs)."""
    z = positions.astype(np.uint64) ^ np.uint64(seed_key(seed))
    with np.errstate(over="ignore"):
        z = z + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def threshold_for(fraction: float) -> int:
    """The rank below which a share `fraction` of all records falls (1.0: every record)."""
    if fraction >= 1.0:
        return RANK_SPACE
    return max(1, int(fraction * RANK_SPACE))


def lowest_ranked(pairs: Iterable[tuple[int, Record]], n: int, *, seed: int,
                  exclude_ids: Iterable[str] = ()) -> list[tuple[int, int, Record]]:
    """(rank, position, record) of the `n` lowest-ranked records not excluded, by rank."""
    drop = set(exclude_ids)
    ranked = sorted((rank(p, seed), p, r) for p, r in pairs if r.id not in drop)
    return ranked[:n]
