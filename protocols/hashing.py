"""Vectorised keyed hash families for local hashing (BLH/OLH, LOLOHA, heavy hitters).

A user's hash function is h_s(v) = ((a·v + b) mod P) mod g with the Carter–Wegman 2-universal family over the
Mersenne prime P = 2^31 - 1; the seed ``s`` (a 62-bit integer, drawn per user) encodes a ∈ [1, P) and b ∈ [0, P).
All arithmetic fits in int64 (a, v < 2^31), so the server evaluates every (user, item) pair with numpy in
chunks — no per-user Python loop and no cryptographic hash per pair. Collision probability for v ≠ v' is at
most about 1/g (the final ``mod g`` adds a bias of at most g/P, negligible for g ≪ 2^31).
"""

from __future__ import annotations

from typing import Any

import numpy as np

P = (1 << 31) - 1
SEED_BITS = 62
MAX_ITEM = P - 1

__all__ = ["P", "draw_seeds", "coefficients", "hash_values", "hash_matrix"]


def draw_seeds(n: int, rng: np.random.Generator) -> np.ndarray:
    """n independent 62-bit hash seeds (int64)."""
    return rng.integers(0, 1 << SEED_BITS, size=n, dtype=np.int64)


def coefficients(seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) of each seed's hash h(v) = ((a·v + b) mod P) mod g, with a ∈ [1, P) and b ∈ [0, P)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    a = (seeds >> 31) % (P - 1) + 1
    b = (seeds & P) % P
    return a, b


def hash_values(seeds: Any, values: Any, g: int) -> np.ndarray:
    """h_seed(value) ∈ [0, g), elementwise with numpy broadcasting of ``seeds`` against ``values``."""
    values = np.asarray(values, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() > MAX_ITEM):
        raise ValueError(f"hashed items must lie in [0, {MAX_ITEM}]")
    a, b = coefficients(np.asarray(seeds))
    return ((a * values + b) % P) % g


def hash_matrix(seeds: Any, k: int, g: int, chunk: int = 1 << 22) -> np.ndarray:
    """The (n, k) matrix H[i, v] = h_{seed_i}(v), built in chunks of about ``chunk`` cells (int16 when g fits)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    dtype = np.int16 if g <= np.iinfo(np.int16).max else np.int64
    out = np.empty((seeds.size, k), dtype=dtype)
    items = np.arange(k, dtype=np.int64)
    rows = max(1, chunk // max(k, 1))
    for start in range(0, seeds.size, rows):
        stop = min(seeds.size, start + rows)
        out[start:stop] = hash_values(seeds[start:stop, None], items[None, :], g)
    return out
