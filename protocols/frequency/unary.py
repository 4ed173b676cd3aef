"""Unary encoding oracles: symmetric (SUE, basic one-time RAPPOR) and optimized (OUE).

Wang, Blocki, Li, Jha, USENIX Security 2017, §4.3. The user one-hot encodes ``x`` into ``k`` bits and flips each
bit independently: the bit of ``x`` is reported as 1 w.p. ``p``, every other bit as 1 w.p. ``q``.

* SUE: ``p = e^{ε/2}/(e^{ε/2}+1)``, ``q = 1 - p`` (two flipped bits each cost ε/2);
* OUE: ``p = 1/2``, ``q = 1/(e^ε+1)``, per-user ``Var[f̂_v] = 4e^ε/(e^ε-1)²`` at ``f = 0``.

Privacy (exact): inputs ``v1 ≠ v2`` differ only in bits v1 and v2, so for any output vector ``b``
``P[b|v1]/P[b|v2] = (P1(b_{v1})·P0(b_{v2}))/(P0(b_{v1})·P1(b_{v2}))`` with ``P1`` the law of the input's bit and
``P0`` of the others; the maximum, at ``b_{v1} = 1, b_{v2} = 0``, is ``p(1-q)/((1-p)q) = e^ε`` for both.

Report format: an ``(n, k)`` uint8 array of 0/1 bits, one row per user (the natural input of the decode, a column
sum). For transport, :meth:`UnaryEncoding.pack` turns it into ``(n, ⌈k/8⌉)`` bytes (``numpy.packbits``, little bit
order) and :meth:`UnaryEncoding.unpack` restores it; ``support_counts`` accepts only the unpacked form.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_category, check_int
from protocols.frequency._common import oracle_epsilon, user_values

__all__ = ["UnaryEncoding", "SUE", "OUE"]

#: Cells of the (users × k) matrix perturbed per chunk: bounds the float64 temporary to ~16 MiB.
_CHUNK_CELLS = 1 << 21


class UnaryEncoding(FrequencyOracle):
    """Unary encoding with bit probabilities ``p`` (the input's bit) and ``q`` (every other bit)."""

    #: dtype of the report rows ``privatize`` returns (0/1 bits).
    report_dtype = np.uint8
    #: the supports of any set of items are independent given the value (independent bits), so the variance of a
    #: sum of item estimates is the sum of their variances: the range-variance formula is exact
    independent_supports = True

    def __init__(self, epsilon: float, k: int, p: float, q: float) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2)
        if not 0.0 <= q < p <= 1.0:
            raise ValueError(f"unary encoding needs 0 <= q < p <= 1, got p={p}, q={q}")
        self.p, self.q = float(p), float(q)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        x = user_values(values, self.k)
        n, k = x.shape[0], self.k
        out = np.empty((n, k), dtype=self.report_dtype)
        rows = max(1, _CHUNK_CELLS // k)
        for start in range(0, n, rows):  # chunks of users, vectorised inside
            stop = min(n, start + rows)
            block = out[start:stop]
            np.less(rng.random((stop - start, k)), self.q, out=block, casting="unsafe")
            block[np.arange(stop - start), x[start:stop]] = rng.random(stop - start) < self.p
        return out

    def privatize_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        x = check_category(value, self.k)
        row = (rng.random(self.k) < self.q).astype(self.report_dtype)
        row[x] = rng.random() < self.p
        return row

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        bits = self._check_bits(reports)
        counts = np.zeros(self.k, dtype=np.int64)
        rows = 65535  # uint16 partial sums cannot overflow below 2^16 rows
        for start in range(0, bits.shape[0], rows):
            counts += bits[start : start + rows].sum(axis=0, dtype=np.uint16)
        return counts

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[privatize(value) = b]`` for each row b: ``∏_j P(b_j)`` (underflows for very large k)."""
        bits = self._check_bits(reports).astype(bool)
        v = int(user_values(value, self.k)[0])
        probs = np.where(bits, self.q, 1.0 - self.q)
        probs[:, v] = np.where(bits[:, v], self.p, 1.0 - self.p)
        return np.prod(probs, axis=1)

    def _check_bits(self, reports: Any) -> np.ndarray:
        bits = np.asarray(reports)
        if bits.ndim != 2 or bits.shape[1] != self.k:
            raise ValueError(f"unary reports must have shape (n, {self.k}), got {bits.shape}")
        if bits.dtype == np.bool_:
            return bits.view(np.uint8)
        if bits.size and not np.issubdtype(bits.dtype, np.integer):
            raise ValueError(f"unary reports must be 0/1 integers or booleans, got dtype {bits.dtype}")
        if bits.dtype != np.uint8:
            if bits.size and (bits.min() < 0 or bits.max() > 1):
                raise ValueError("unary reports must contain only 0 and 1")
            bits = bits.astype(np.uint8)
        elif bits.size and bits.max() > 1:
            raise ValueError("unary reports must contain only 0 and 1")
        return bits

    @staticmethod
    def pack(reports: np.ndarray) -> np.ndarray:
        """``(n, k)`` bits → ``(n, ⌈k/8⌉)`` uint8 (little bit order), 8× smaller on the wire."""
        return np.packbits(np.asarray(reports, dtype=np.uint8), axis=1, bitorder="little")

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`pack` for this oracle's k."""
        packed = np.asarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape[1] != (self.k + 7) // 8:
            raise ValueError(f"packed reports must have shape (n, {(self.k + 7) // 8}), got {packed.shape}")
        return np.unpackbits(packed, axis=1, count=self.k, bitorder="little")


class SUE(UnaryEncoding):
    """Symmetric unary encoding (basic one-time RAPPOR): ``p = e^{ε/2}/(e^{ε/2}+1)``, ``q = 1 - p``."""

    def __init__(self, epsilon: float, k: int) -> None:
        eps = oracle_epsilon(epsilon)
        t = math.exp(-eps / 2)  # stable for any finite ε
        super().__init__(eps, k, p=1.0 / (1.0 + t), q=t / (1.0 + t))


class OUE(UnaryEncoding):
    """Optimized unary encoding: ``p = 1/2``, ``q = 1/(e^ε+1)``; ``Var = 4e^ε/(e^ε-1)²`` per user at f = 0."""

    def __init__(self, epsilon: float, k: int) -> None:
        eps = oracle_epsilon(epsilon)
        t = math.exp(-eps)
        super().__init__(eps, k, p=0.5, q=t / (1.0 + t))
