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

from protocols.base import check_int

P = (1 << 31) - 1
SEED_BITS = 62
MAX_ITEM = P - 1

__all__ = ["P", "draw_seeds", "coefficients", "hash_values", "hash_one", "hash_matrix", "support_counts",
           "support_prefix_moments"]


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


def hash_one(seed: int, value: int, g: int) -> int:
    """:func:`hash_values` of one seed and one item already checked to lie in [0, MAX_ITEM], in Python integers (a
    device hashes one value per report; exact, as int64 is: a·v + b < 2^62): :func:`coefficients`' a and b, then
    ``((a·v + b) mod P) mod g``."""
    a, b = (seed >> 31) % (P - 1) + 1, (seed & P) % P
    return (a * value + b) % P % g


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


#: Users per chunk of the residue walk: five uint32/bool work arrays of this length (~2 MiB) stay near the L2 cache;
#: larger chunks amortise the per-item numpy call overhead (measured best at n = 10^5).
WALK_CHUNK = 1 << 17
#: Below this many users, or for g ≥ 2^32, :func:`support_counts` evaluates blocks of (user, item) pairs instead of
#: walking the items: the walk pays a few numpy calls per item whatever the number of users.
WALK_MIN_USERS = 2048
#: Users per chunk of :func:`support_prefix_moments`' walk: its running sums add a float64 vector per chunk, so a
#: smaller chunk keeps the work arrays in cache.
PREFIX_WALK_CHUNK = 1 << 13
_FLOAT_LIMIT = 1 << 20  # k and g up to 2^20 keep every float64 quantity below exact-integer limits


def support_counts(seeds: Any, reported: Any, k: int, g: int, *, strategy: str = "auto", chunk: int = WALK_CHUNK,
                   rows: int = 512) -> np.ndarray:
    """``C_v = #{i : h_{s_i}(v) = y_i}`` for every v in [0, k): how many reports (seed, y) support each item — the
    one local-hashing decoder, used by OLH/BLH (:mod:`protocols.frequency.local_hashing`, Wang et al., USENIX
    Security 2017) and LOLOHA (:mod:`protocols.longitudinal.loloha`, Arcolezi et al., EDBT 2023). Equals
    ``(hash_matrix(seeds, k, g) == y[:, None]).sum(axis=0)`` without materialising the (n, k) matrix.

    ``strategy``: ``"walk"`` — the residues r_v = (a·v + b) mod P obey r_0 = b and
    r_{v+1} = r_v + a − P·[r_v + a ≥ P], so the items are walked once with a few uint32 operations per item over
    all users (chunks of ``chunk``; g < 2^32); ``"blocks"`` — blocks of ``rows`` users × all items
    (:func:`_blocks_counts`); ``"auto"`` — the walk from :data:`WALK_MIN_USERS` users on (g < 2^32), else blocks.
    ValueError on mismatched lengths, y outside [0, g), or a walk with g ≥ 2^32.
    """
    seeds, y, k, g = _check_reports(seeds, reported, k, g)
    if strategy not in ("auto", "walk", "blocks"):
        raise ValueError(f"strategy must be auto, walk or blocks, got {strategy!r}")
    if strategy == "walk" and g >= 1 << 32:
        raise ValueError("the residue walk works in uint32: it needs g < 2^32 (use strategy='blocks')")
    if strategy == "walk" or (strategy == "auto" and seeds.size >= WALK_MIN_USERS and g < 1 << 32):
        return _walk_counts(seeds, y, k, g, max(1, int(chunk)))[0]
    a, b = coefficients(seeds)
    return _blocks_counts(a, b, y, k, g, rows)


def support_prefix_moments(seeds: Any, reported: Any, k: int, g: int, *,
                           chunk: int = PREFIX_WALK_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """``(C, Q)``: the support counts ``C_v`` of :func:`support_counts` and ``Q_m = Σ_i S_i(m)²``, where
    ``S_i(m) = #{v ≤ m : h_{s_i}(v) = y_i}`` is how many of the items 0..m report i supports (m in [0, k)).

    ``Σ_i S_i(m) = C_0 + … + C_m``, so with ``Q`` the prefix supports' empirical variance over the reports is
    known from additive statistics: what a prefix (CDF) estimate's variance needs when the supports of distinct
    items are correlated (the hash family is 2- but not 3-wise independent; :mod:`protocols.distribution.flat`).
    From :data:`WALK_MIN_USERS` users on (g < 2^32) by the residue walk, each user's running S_i kept in a float64
    vector of the chunk; below, in blocks of users × all items (:func:`hash_matrix`, cumulative sums along the
    items). Exact while every partial sum of squares stays below 2^53 (n·k² < 2^53). ValueError as
    :func:`support_counts`.
    """
    seeds, y, k, g = _check_reports(seeds, reported, k, g)
    if seeds.size >= WALK_MIN_USERS and g < 1 << 32:
        counts, squares = _walk_counts(seeds, y, k, g, max(1, int(chunk)), prefix=True)
        assert squares is not None
        return counts, squares
    counts = np.zeros(k, dtype=np.int64)
    squares = np.zeros(k)
    rows = max(1, (1 << 20) // k)
    for start in range(0, seeds.size, rows):
        stop = min(seeds.size, start + rows)
        hits = hash_matrix(seeds[start:stop], k, g) == y[start:stop, None]
        counts += hits.sum(axis=0, dtype=np.int64)
        running = np.cumsum(hits, axis=1, dtype=np.float64)
        squares += np.einsum("ij,ij->j", running, running)
    return counts, squares


def _check_reports(seeds: Any, reported: Any, k: Any, g: Any) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Flattened int64 seeds and reported values, k and g validated (ValueError otherwise)."""
    seeds = np.asarray(seeds, dtype=np.int64).ravel()
    y = np.asarray(reported, dtype=np.int64).ravel()
    if seeds.shape != y.shape:
        raise ValueError("seeds and reported values must have the same length")
    k, g = check_int(k, "k", 1), check_int(g, "g", 2)
    if y.size and (y.min() < 0 or y.max() >= g):
        raise ValueError(f"reported hash values must lie in [0, {g})")
    if k > P - 1:
        raise ValueError("domain too large for the hash family")
    return seeds, y, k, g


def _walk_counts(seeds: np.ndarray, y: np.ndarray, k: int, g: int, chunk: int,
                 prefix: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The residue walk: every item once, all users of a chunk updated per item with a few uint32 operations.
    Returns the support counts and, with ``prefix``, ``Σ_i S_i(v)²`` (:func:`support_prefix_moments`)."""
    n = seeds.shape[0]
    counts = np.zeros(k, dtype=np.int64)
    squares = np.zeros(k) if prefix else None
    if n == 0:
        return counts, squares
    a_all, b_all = coefficients(seeds)  # a ∈ [1, P), b ∈ [0, P): every residue and r + a fit in uint32
    p32, g32 = np.uint32(P), np.uint32(g)
    mask = np.uint32(g - 1) if g & (g - 1) == 0 else None
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        a = a_all[start:stop].astype(np.uint32)
        r = b_all[start:stop].astype(np.uint32)
        target = y[start:stop].astype(np.uint32)
        tmp = np.empty_like(r)
        h = np.empty_like(r)
        hit = np.empty(r.shape, dtype=bool)
        running = np.zeros(r.shape) if prefix else None  # S_i(v) of the chunk's users
        for v in range(k):  # loop over items, vectorised over the users of the chunk
            if v:
                np.add(r, a, out=r)  # r + a < 2P < 2^32
                np.subtract(r, p32, out=tmp)  # wraps to > r when r < P
                np.minimum(r, tmp, out=r)  # r = (r + a) mod P
            if mask is not None:
                np.bitwise_and(r, mask, out=h)
            else:
                np.floor_divide(r, g32, out=h)
                np.multiply(h, g32, out=h)
                np.subtract(r, h, out=h)
            np.equal(h, target, out=hit)
            counts[v] += np.count_nonzero(hit)
            if running is not None:
                np.add(running, hit, out=running)
                squares[v] += running @ running  # type: ignore[index]
    return counts, squares


def _blocks_counts(a: np.ndarray, b: np.ndarray, y: np.ndarray, k: int, g: int, rows: int) -> np.ndarray:
    """Blocks of ``rows`` users × every item, held in cache (no per-user Python loop):

    * k, g ≤ 2^20 (float64 path): x = a·v + b comes from ONE matrix product [a b]·[v; 1] and is an exact integer
      (< 2^52); ⌊x/P⌋ and ⌊r/g⌋ use IEEE-correctly-rounded division, which is exact here because the distance of
      x/P from an integer (≥ 1/P) exceeds half an ulp, likewise for r/g; all products and differences are exact;
    * otherwise (uint64 path): Mersenne reduction x mod P = (x & P) + (x >> 31) then one conditional subtraction,
      and x mod g by an exact multiply-shift (Granlund & Montgomery, PLDI 1994: ⌊x/g⌋ = ⌊x·m / 2^{31+ℓ}⌋ for
      x < 2^31, ℓ = ⌈log2 g⌉, m = ⌈2^{31+ℓ}/g⌉, no overflow).
    """
    rows = max(1, min(rows, max(1, a.size)))
    if k <= _FLOAT_LIMIT and g <= _FLOAT_LIMIT:
        return _support_counts_float(a, b, y, k, g, rows)
    return _support_counts_uint(a, b, y, k, g, rows)


def _support_counts_float(a: np.ndarray, b: np.ndarray, y: np.ndarray, k: int, g: int, rows: int) -> np.ndarray:
    coef = np.column_stack([a, b]).astype(np.float64)
    grid = np.vstack([np.arange(k, dtype=np.float64), np.ones(k)])
    yf = y.astype(np.float64)
    p_f, g_f = float(P), float(g)
    counts = np.zeros(k, dtype=np.int64)
    x = np.empty((rows, k))
    tmp = np.empty((rows, k))
    mask = np.empty((rows, k), dtype=bool)
    for start in range(0, a.size, rows):
        r = min(rows, a.size - start)
        xs, ts, ms = x[:r], tmp[:r], mask[:r]
        np.dot(coef[start : start + r], grid, out=xs)  # a·v + b, exact
        np.divide(xs, p_f, out=ts)
        np.floor(ts, out=ts)
        ts *= p_f
        xs -= ts  # (a·v + b) mod P
        np.divide(xs, g_f, out=ts)
        np.floor(ts, out=ts)
        ts *= g_f
        xs -= ts  # ... mod g
        np.equal(xs, yf[start : start + r, None], out=ms)
        counts += ms.view(np.uint8).sum(axis=0, dtype=np.int64)
    return counts


def _support_counts_uint(a: np.ndarray, b: np.ndarray, y: np.ndarray, k: int, g: int, rows: int) -> np.ndarray:
    au, bu, yu = a.astype(np.uint64), b.astype(np.uint64), y.astype(np.uint64)
    ell = (g - 1).bit_length()
    shift = np.uint64(31 + ell)
    magic = np.uint64(-(-(1 << (31 + ell)) // g))
    gu, pu, s31 = np.uint64(g), np.uint64(P), np.uint64(31)
    items = np.arange(k, dtype=np.uint64)
    counts = np.zeros(k, dtype=np.int64)
    x = np.empty((rows, k), dtype=np.uint64)
    tmp = np.empty((rows, k), dtype=np.uint64)
    mask = np.empty((rows, k), dtype=bool)
    for start in range(0, a.size, rows):
        r = min(rows, a.size - start)
        xs, ts, ms = x[:r], tmp[:r], mask[:r]
        np.multiply(au[start : start + r, None], items[None, :], out=xs)
        xs += bu[start : start + r, None]
        np.right_shift(xs, s31, out=ts)
        xs &= pu
        xs += ts
        np.subtract(xs, pu, out=ts)
        np.minimum(xs, ts, out=xs)  # conditional subtraction (x - P wraps when x < P)
        np.multiply(xs, magic, out=ts)
        ts >>= shift
        ts *= gu
        xs -= ts
        np.equal(xs, yu[start : start + r, None], out=ms)
        counts += ms.view(np.uint8).sum(axis=0, dtype=np.int64)
    return counts
