"""Hadamard response (HR) and a vectorised fast Walsh–Hadamard transform.

Acharya, Sun, Zhang, "Hadamard response: estimating distributions privately, efficiently, and with little
communication", AISTATS 2019 (the single-set, high-privacy variant). Let ``K = 2^⌈log2(k+1)⌉`` and ``H`` the
K×K Sylvester–Hadamard matrix, ``H[i, y] = (-1)^{popcount(i & y)}``. Item x uses row ``x + 1`` (row 0 is all ones
and is skipped) and the set ``C_x = {y : H[x+1, y] = +1}`` of size K/2. The user outputs y uniform on ``C_x`` with
probability ``p = e^ε/(1+e^ε)``, else uniform on its complement, so

    P[y | x] = 2p/K  (y ∈ C_x),   2(1-p)/K  (y ∉ C_x),      worst-case ratio p/(1-p) = e^ε exactly.

Sampling (vectorised): draw y0 uniform on [0, K); its parity ``popcount((x+1) & y0) mod 2`` says whether
y0 ∈ C_x; if that is not the half we want, flip the lowest set bit of x+1 in y0 — a bijection between the two
halves, so the result is uniform on the chosen half.

Estimator. For rows ``x+1 ≠ v+1`` (both non-zero) the rows are orthogonal and balanced, so
``Σ_{y∈C_x} H[v+1, y] = Σ_y H[v+1, y](1 + H[x+1, y])/2 = 0``: a non-holder's ``H[v+1, Y]`` has mean 0, and a
holder's has mean ``p - (1-p) = (e^ε-1)/(e^ε+1)``. Hence, with ``N`` the histogram of the outputs and ``W = H·N``
its Walsh–Hadamard transform (one FWHT, O(K log K), for *all* items),

    f̂_v = (1/n)·((e^ε+1)/(e^ε-1))·W[v+1]                                                     (unbiased).

This is exactly the generic oracle estimator with the support event ``y ∈ C_v`` (``C_v = (n + W[v+1])/2``),
``p = e^ε/(e^ε+1)`` and ``q = 1/2`` (a non-holder lands in C_v w.p. 1/2), so the inherited ``estimate`` and
``variance`` apply unchanged. Per user, ``H[v+1, Y]·B`` with ``B = (e^ε+1)/(e^ε-1)`` has variance ``B²`` for a
non-holder and ``B² - 1`` for a holder:

    Var[f̂_v] = B² - f_v   per user   (= q(1-q)/(p-q)² + f(1-p-q)/(p-q)).

Note: ``B² = 4e^ε/(e^ε-1)² · (e^ε+1)²/(4e^ε)``, so this variant matches OUE/OLH's ``4e^ε/(e^ε-1)²`` only as ε → 0
(1.27× at ε = 1, 2.4× at ε = 2); the paper's general-ε HR with blocks is not implemented here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_int
from protocols.frequency._common import keep_probability, oracle_epsilon, report_vector, user_values

__all__ = ["HadamardResponse", "fwht", "hadamard_entries"]

#: Largest supported domain: K = 2^26 outputs (a 512 MiB histogram transform is the practical limit).
MAX_K = (1 << 26) - 1


def fwht(x: Any) -> np.ndarray:
    """Unnormalised Walsh–Hadamard transform along the last axis: ``out = x @ H_K`` (Sylvester order).

    ``K`` (the last dimension) must be a power of two. Vectorised butterflies: at stage h the array is viewed as
    ``(..., K/2h, 2, h)`` and each pair ``(u, w)`` becomes ``(u + w, u - w)``; log2(K) stages, O(K log K) work.
    Integer input stays integer (exact), float input stays float.
    """
    arr = np.array(x, copy=True)
    if arr.dtype.kind not in "iuf":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind == "u":
        arr = arr.astype(np.int64)
    K = arr.shape[-1] if arr.ndim else 0
    if K < 1 or K & (K - 1):
        raise ValueError(f"the transform length must be a power of two, got {K}")
    lead = arr.shape[:-1]
    h = 1
    while h < K:
        view = arr.reshape(*lead, K // (2 * h), 2, h)
        u = view[..., 0, :].copy()
        view[..., 0, :] += view[..., 1, :]
        np.subtract(u, view[..., 1, :], out=view[..., 1, :])
        h *= 2
    return arr


def _parity(v: np.ndarray) -> np.ndarray:
    """popcount(v) mod 2 for non-negative int64 values, elementwise."""
    if hasattr(np, "bitwise_count"):
        return (np.bitwise_count(v) & 1).astype(np.int64)
    v = v.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        v ^= v >> shift
    return v & 1


def hadamard_entries(rows: Any, cols: Any) -> np.ndarray:
    """``H[rows, cols] = (-1)^{popcount(rows & cols)}`` elementwise with broadcasting (int8 ±1)."""
    r = np.asarray(rows, dtype=np.int64)
    c = np.asarray(cols, dtype=np.int64)
    return (1 - 2 * _parity(r & c)).astype(np.int8)


class HadamardResponse(FrequencyOracle):
    """Hadamard response over ``[0, k)``; reports are int64 outputs ``y ∈ [0, K)``, ``K = 2^⌈log2(k+1)⌉``."""

    def __init__(self, epsilon: float, k: int) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2, maximum=MAX_K)
        self.K = 1 << math.ceil(math.log2(self.k + 1))
        self.p, _ = keep_probability(self.epsilon, 1)  # e^ε/(e^ε+1)
        self.q = 0.5

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        row = user_values(values, self.k) + 1
        n = row.shape[0]
        y0 = rng.integers(0, self.K, size=n, dtype=np.int64)
        in_c = _parity(row & y0) == 0
        want_c = rng.random(n) < self.p
        lowest_bit = row & -row
        return np.where(in_c == want_c, y0, y0 ^ lowest_bit)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """``C_v = #{i : y_i ∈ C_v} = (n + W[v+1])/2`` with W the FWHT of the output histogram."""
        y = report_vector(reports, self.K)
        transform = fwht(np.bincount(y, minlength=self.K).astype(np.int64))
        return (y.shape[0] + transform[1 : self.k + 1]) // 2

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[y | value]``: ``2p/K`` on ``C_value``, ``2(1-p)/K`` off it."""
        y = report_vector(reports, self.K)
        v = int(user_values(value, self.k)[0])
        in_c = hadamard_entries(v + 1, y) == 1
        return np.where(in_c, 2 * self.p / self.K, 2 * (1 - self.p) / self.K)
