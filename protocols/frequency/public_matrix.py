"""Source 001's frequency oracle: randomized response on one entry of a public random ±1 matrix (SPEC §3.8).

Bassily–Smith style (STOC 2015). A public matrix ``Z ∈ {±1}^{k×n}`` has i.i.d. uniform entries; user i holding
``x_i`` sends ``y_i = Z[x_i, i]`` w.p. ``p = e^ε/(e^ε+1)`` and ``-Z[x_i, i]`` otherwise, together with its index i
(reports are ``(n, 2)`` int64 ``[i, y]``). The server estimates every item at once:

    f̂_x = (1/n) · ((e^ε+1)/(e^ε-1)) · Σ_i y_i Z[x, i].

Unbiasedness (over the randomized response and the random matrix): ``E[y_i Z[x_i, i]] = 2p - 1 = (e^ε-1)/(e^ε+1)``,
and for ``x ≠ x_i`` the entry ``Z[x, i]`` is independent of ``y_i`` and uniform, so ``E[y_i Z[x, i]] = 0``. Source 001
writes the randomized response as ``1/2 ± ε'`` and estimates *counts*, ``(1/(2ε'))·Σ y_i Z[x, i]``; with
``1/2 + ε' = e^ε/(e^ε+1)`` its constant is ``1/(2ε') = (e^ε+1)/(e^ε-1) = coth(ε/2)`` — the same, ≈ 2/ε for small ε
(the SPEC's "2ε'" is *not* the privacy budget). Equivalently, with support event ``y_i = Z[v, i]`` the generic
oracle estimator applies with ``p = e^ε/(e^ε+1)``, ``q = 1/2`` and ``C_v = (n + Σ_i y_i Z[v, i])/2``; the per-user
variance is ``B² - f_v`` with ``B = (e^ε+1)/(e^ε-1)``, as for Hadamard response.

Privacy (exact, for every fixed Z and index i): ``P[y|v1]/P[y|v2]`` is ``p/(1-p) = e^ε`` when
``Z[v1, i] ≠ Z[v2, i]`` and 1 otherwise.

The matrix is never stored. Entry ``Z[x, i]`` is bit ``x mod 128`` of the Philox4x32-10 block
``PRF_key(counter = (i mod 2^32, i div 2^32, x div 128, 0))`` (Salmon, Moraes, Dror, Shaw, "Parallel random numbers:
as easy as 1, 2, 3", SC 2011; verified against the Random123 known-answer vectors), +1 for a set bit. The 64-bit
Philox key is the first 8 bytes of ``SHA-256("haarvest/public-matrix/v1" ‖ key)``; ``key`` is public and fixed by
the coordinator before collection (it must not depend on the data). A device evaluates one Philox block; the server
evaluates ``⌈k/128⌉`` blocks per user, vectorised. Philox is a statistically strong counter-based generator, not a
cryptographic PRF — enough here, since Z is public and only needs to look random and data-independent.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_int
from protocols.frequency._common import keep_probability, oracle_epsilon, report_matrix, user_values

__all__ = ["PublicMatrixOracle", "philox4x32"]

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_BITS_PER_BLOCK = 128
#: Users per decode chunk (bounds the unpacked bit matrix to chunk × 128⌈k/128⌉ bytes).
_DECODE_CHUNK = 1 << 13  # measured best at k = 360


def philox4x32(counter: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Philox4x32-R on an array of 128-bit counters ``(..., 4)`` uint32 under a 64-bit key ``(k0, k1)``.

    Round: ``(c0, c1, c2, c3) → (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0))``; the key is bumped by
    the Weyl constants (W0, W1) before every round after the first. Products are exact in uint64.
    """
    ctr = np.asarray(counter)
    if ctr.shape[-1:] != (4,):
        raise ValueError(f"counters must have shape (..., 4), got {ctr.shape}")
    c0, c1, c2, c3 = (ctr[..., j].astype(np.uint64) for j in range(4))
    k0, k1 = int(key[0]) & _MASK32, int(key[1]) & _MASK32
    m0, m1, mask = np.uint64(_M0), np.uint64(_M1), np.uint64(_MASK32)
    shift = np.uint64(32)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0 = c0 * m0
        p1 = c2 * m1
        c0, c1, c2, c3 = (
            (p1 >> shift) ^ c1 ^ np.uint64(k0),
            p1 & mask,
            (p0 >> shift) ^ c3 ^ np.uint64(k1),
            p0 & mask,
        )
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _derive_key(key: Any) -> tuple[int, int]:
    if isinstance(key, bytes):
        raw = key
    elif isinstance(key, str):
        raw = key.encode("utf-8")
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        value = int(key)
        if value < 0:
            raise ValueError("an integer key must be non-negative")
        raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    else:
        raise ValueError(f"key must be bytes, str or a non-negative int, got {type(key).__name__}")
    if not raw:
        raise ValueError("key must not be empty")
    digest = hashlib.sha256(b"haarvest/public-matrix/v1" + raw).digest()
    return int.from_bytes(digest[0:4], "little"), int.from_bytes(digest[4:8], "little")


class PublicMatrixOracle(FrequencyOracle):
    """Randomized response on a public keyed ±1 matrix; reports are ``(n, 2)`` int64 ``[user index, ±1]``."""

    def __init__(self, epsilon: float, k: int, key: bytes | str | int) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2, maximum=1 << 32)
        self._philox_key = _derive_key(key)
        self.p, _ = keep_probability(self.epsilon, 1)  # e^ε/(e^ε+1)
        self.q = 0.5

    @staticmethod
    def fresh_key() -> bytes:
        """A new random public key (OS entropy) for the coordinator to publish with a collection round."""
        return secrets.token_bytes(16)

    # -- the public matrix -------------------------------------------------------------------------------------
    def _blocks(self, users: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        users = users.astype(np.uint64)
        counter = np.stack(
            np.broadcast_arrays(
                users & np.uint64(_MASK32), users >> np.uint64(32), blocks.astype(np.uint64), np.uint64(0)
            ),
            axis=-1,
        )
        return philox4x32(counter, self._philox_key)

    def entries(self, items: Any, users: Any) -> np.ndarray:
        """``Z[items, users]`` elementwise with broadcasting (int8 ±1), recomputed from the PRF."""
        x = np.asarray(items, dtype=np.int64)
        i = self._user_index(users)
        if x.size and (x.min() < 0 or x.max() >= self.k):
            raise ValueError(f"items must lie in [0, {self.k})")
        x, i = np.broadcast_arrays(x, i)
        words = self._blocks(i, x // _BITS_PER_BLOCK)
        t = x % _BITS_PER_BLOCK
        word = np.take_along_axis(words, (t // 32)[..., None], axis=-1)[..., 0]
        bit = (word >> (t % 32).astype(np.uint32)) & np.uint32(1)
        return (2 * bit.astype(np.int8) - 1).astype(np.int8)

    def columns(self, users: Any) -> np.ndarray:
        """``Z[:, users]`` transposed: an ``(len(users), k)`` uint8 array of bits (1 ⇔ entry +1)."""
        i = self._user_index(users).reshape(-1)
        nblocks = -(-self.k // _BITS_PER_BLOCK)
        words = self._blocks(i[:, None], np.arange(nblocks)[None, :]).astype("<u4")
        raw = words.view(np.uint8).reshape(i.shape[0], nblocks * 16)
        return np.unpackbits(raw, axis=1, count=self.k, bitorder="little")

    # -- the oracle --------------------------------------------------------------------------------------------
    def privatize(self, values: Any, rng: np.random.Generator, user_ids: Any = None) -> np.ndarray:
        """Reports ``[i, y_i]``; ``user_ids`` are the users' distinct public indices (default ``0..n-1``)."""
        x = user_values(values, self.k)
        n = x.shape[0]
        ids = np.arange(n, dtype=np.int64) if user_ids is None else self._user_index(user_ids).reshape(-1)
        if ids.shape[0] != n:
            raise ValueError(f"user_ids must have one entry per user ({n}), got {ids.shape[0]}")
        z = self.entries(x, ids).astype(np.int64)
        keep = rng.random(n) < self.p
        return np.stack([ids, np.where(keep, z, -z)], axis=1)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """``C_v = #{i : y_i = Z[v, i]}`` for every v, in chunks of users (vectorised; Z recomputed, never stored).

        A user with ``y_i = -1`` matches exactly where its column has a 0 bit, so its packed Philox words are
        complemented before unpacking; ``C`` is then a plain column sum of the bits.
        """
        ids, y = self._split(reports)
        nblocks = -(-self.k // _BITS_PER_BLOCK)
        counts = np.zeros(self.k, dtype=np.int64)
        for start in range(0, ids.shape[0], _DECODE_CHUNK):
            chunk_ids = ids[start : start + _DECODE_CHUNK]
            words = self._blocks(chunk_ids[:, None], np.arange(nblocks)[None, :]).astype("<u4")
            flip = np.where(y[start : start + _DECODE_CHUNK] < 0, np.uint32(_MASK32), np.uint32(0))
            words ^= flip[:, None, None].astype("<u4")
            raw = words.view(np.uint8).reshape(chunk_ids.shape[0], nblocks * 16)
            bits = np.unpackbits(raw, axis=1, count=self.k, bitorder="little")
            counts += np.add.reduce(bits, axis=0, dtype=np.uint32)
        return counts

    def correlations(self, reports: np.ndarray) -> np.ndarray:
        """``S_v = Σ_i y_i Z[v, i] = 2·C_v - n`` (the source's statistic; ``f̂_v = B·S_v/n``)."""
        return 2 * self.support_counts(reports) - self.n_reports(reports)

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[y | i, value]`` for each report ``[i, y]``: p if ``y = Z[value, i]`` else 1-p."""
        ids, y = self._split(reports, require_distinct=False)
        v = int(user_values(value, self.k)[0])
        return np.where(self.entries(v, ids) == y, self.p, 1.0 - self.p)

    def _user_index(self, users: Any) -> np.ndarray:
        i = np.asarray(users)
        if i.size and not np.issubdtype(i.dtype, np.integer):
            raise ValueError(f"user indices must be integers, got dtype {i.dtype}")
        i = i.astype(np.int64)
        if i.size and i.min() < 0:
            raise ValueError("user indices must be non-negative")
        return i

    def _split(self, reports: Any, require_distinct: bool = True) -> tuple[np.ndarray, np.ndarray]:
        arr = report_matrix(reports, 2).astype(np.int64, copy=False)
        ids, y = self._user_index(arr[:, 0]), arr[:, 1]
        if arr.size and not np.all(np.abs(y) == 1):
            raise ValueError("public-matrix reports must be ±1")
        if require_distinct and ids.size > 1 and not np.all(ids[1:] > ids[:-1]):  # fast path: increasing ids
            ordered = np.sort(ids)
            if np.any(ordered[1:] == ordered[:-1]):
                raise ValueError("user indices must be distinct (each user owns one column of Z)")
        return ids, y
