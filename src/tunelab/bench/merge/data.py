"""Deterministic input chunks and the hash partitioning every transport shares.

On worker ``r`` of ``N`` with ``n`` rows per chunk:

* the **left** chunk has ``key = r·n … (r+1)·n − 1`` and a random int64 ``payload``;
* the **right** chunk has ``n`` rows: for every worker ``i`` a random share of worker ``i``'s
  key range (``M = floor(frac_match·n)`` matching keys per worker in total, split so that no
  key is drawn twice by different workers), plus ``n − M`` keys that match nothing
  (``≥ N·n``), shuffled.

So the global inner merge has exactly ``N·M`` rows (:func:`expected_matches`), and any worker
can rebuild any other worker's chunk from the seed (used by the full verification). The
merged rows' :func:`row_checksum` summed over all workers must equal the sum of every
worker's :func:`expected_checksum` (the content check that runs at every size).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "expected_checksum",
    "expected_matches",
    "left_chunk",
    "match_counts",
    "destinations",
    "partition_ids",
    "right_chunk",
    "row_checksum",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MOD = 1 << 64


def match_counts(workers: int, chunk_size: int, frac_match: float) -> np.ndarray:
    """``m[r, i]``: how many keys of worker ``i``'s range worker ``r``'s right chunk holds.

    Every column and every row sums to ``M = floor(frac_match · chunk_size)``.
    """
    total = int(np.floor(frac_match * chunk_size))
    base, rem = divmod(total, workers)
    r = np.arange(workers)[:, None]
    i = np.arange(workers)[None, :]
    return base + (((r + i) % workers) < rem).astype(np.int64)


def expected_matches(workers: int, chunk_size: int, frac_match: float) -> int:
    """Rows of the global inner merge: ``workers · floor(frac_match · chunk_size)``."""
    return int(match_counts(workers, chunk_size, frac_match).sum())


def left_chunk(
    rank: int, workers: int, chunk_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(key, payload)`` of worker ``rank``'s left chunk."""
    del workers  # the left chunk depends on the rank only
    key = np.arange(rank * chunk_size, (rank + 1) * chunk_size, dtype=np.int64)
    rng = np.random.default_rng([seed, 0, rank])
    payload = rng.integers(0, 2**62, size=chunk_size, dtype=np.int64)
    return key, payload


def right_chunk(
    rank: int, workers: int, chunk_size: int, frac_match: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(key, payload)`` of worker ``rank``'s right chunk (see the module docstring)."""
    counts = match_counts(workers, chunk_size, frac_match)
    parts = []
    for i in range(workers):
        # The same permutation of worker i's range on every worker; each takes its own slice.
        perm = np.random.default_rng([seed, 1, i]).permutation(chunk_size)
        start = int(counts[:rank, i].sum())
        parts.append(perm[start : start + counts[rank, i]].astype(np.int64) + i * chunk_size)
    n_match = int(counts[rank].sum())
    first_miss = workers * chunk_size + rank * chunk_size
    parts.append(np.arange(first_miss, first_miss + chunk_size - n_match, dtype=np.int64))
    key = np.concatenate(parts)
    rng = np.random.default_rng([seed, 2, rank])
    rng.shuffle(key)
    payload = rng.integers(0, 2**62, size=chunk_size, dtype=np.int64)
    return key, payload


def partition_ids(key: Any, workers: int) -> Any:
    """Destination worker of each key: a multiplicative (Fibonacci) hash modulo ``workers``.

    Works on numpy and cupy arrays alike (uint64 arithmetic wraps)."""
    h = key.astype(np.uint64) * _GOLDEN
    return ((h >> np.uint64(32)) % np.uint64(workers)).astype(np.int64)


def destinations(key: np.ndarray, workers: int, scratch: np.ndarray) -> np.ndarray:
    """:func:`partition_ids` of a host array as the narrowest unsigned type that holds
    ``workers`` (so a stable ``argsort`` is a radix sort), computed in place in ``scratch``
    (uint64, at least ``len(key)``): no temporary of the chunk's size is allocated."""
    h = scratch[:len(key)]
    np.multiply(key.view(np.uint64), _GOLDEN, out=h)
    np.right_shift(h, np.uint64(32), out=h)
    np.remainder(h, np.uint64(workers), out=h)
    return h.astype(np.uint8 if workers <= 256 else np.uint16 if workers <= 65536
                    else np.uint32)


def row_checksum(key: np.ndarray, payload_left: np.ndarray, payload_right: np.ndarray) -> int:
    """Order-independent checksum of merged rows: the sum modulo 2⁶⁴ of a 64-bit mix of each
    row's key and both payloads. Every step of the mix is a bijection of the value it takes
    in, so one changed key or payload always changes the sum."""
    h = np.multiply(np.asarray(key, dtype=np.int64).view(np.uint64), _GOLDEN)
    h ^= np.asarray(payload_left, dtype=np.int64).view(np.uint64) * _MIX1
    h ^= h >> np.uint64(31)
    h *= _MIX2
    h ^= np.asarray(payload_right, dtype=np.int64).view(np.uint64)
    h ^= h >> np.uint64(29)
    h *= _MIX1
    h ^= h >> np.uint64(32)
    return int(h.sum(dtype=np.uint64))


def expected_checksum(workers: int, chunk_size: int, seed: int, right_key: np.ndarray,
                      right_payload: np.ndarray) -> int:
    """:func:`row_checksum` of the merged rows a right chunk (``right_key``,
    ``right_payload``) takes part in: each of its keys below ``workers · chunk_size`` meets
    the left row of that key, whose payload is regenerated from the seed one left chunk at a
    time (O(workers · chunk_size) time, O(chunk_size) memory)."""
    total = 0
    for i in range(workers):
        lo = i * chunk_size
        sel = (right_key >= lo) & (right_key < lo + chunk_size)
        keys = right_key[sel]
        if keys.size:
            payload = left_chunk(i, workers, chunk_size, seed)[1]
            total += row_checksum(keys, payload[keys - lo], right_payload[sel])
    return total % _MOD
