"""Duchi et al.'s mechanisms: 1-D binary output (SPEC §3.1) and the multi-dimensional sign mechanism (§3.5).

Reference: J. C. Duchi, M. I. Jordan, M. J. Wainwright, *Minimax Optimal Procedures for Locally Private
Estimation*, JASA 113(521), 2018 (Sec. 4.2.3, the ℓ∞ mechanism); also used as the baseline in Wang et al.,
*Collecting and Analyzing Multidimensional Data with Local Differential Privacy*, ICDE 2019.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fractions import Fraction

from protocols.base import check_unit_interval
from protocols.exact import ratio_weights, uniform_below, uniform_below_array

from ._common import (
    VectorMeanMechanism,
    as_result,
    check_bounded_epsilon,
    check_dimension,
    check_rng,
)
from ._grid import GridMechanism

__all__ = ["Duchi", "DuchiMultiDim", "duchi_constant"]


class Duchi(GridMechanism):
    """Duchi 1-D, released exactly: index 1 (``+B``) or 0 (``−B``), ``B = (H + L)/(H − L)`` with ``H/L ≤ e^ε``
    (:func:`protocols.exact.ratio_weights`; the continuous ``(e^ε + 1)/(e^ε − 1)`` within 2^-39 relative).

    The input is rounded randomly to ``v = ±1`` (``P[v = 1] = (1 + t)/2``), then ``+B`` is released w.p. ``H/(H+L)``
    when v = 1 and ``L/(H+L)`` when v = −1 — one exact draw. So ``P[+B | t] = 1/2 + t/(2B)``, ``E[y] = t``,
    ``Var = B² − t²``; the channel over ``v ∈ {−1, 1}`` has ratio exactly ``H/L ≤ e^ε``.
    """

    def __init__(self, epsilon: float) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        self.high, self.low = ratio_weights(self.epsilon)
        self.grid = self.inputs = 2

    def _estimates(self) -> np.ndarray:
        b = (self.high + self.low) / (self.high - self.low)
        return np.array([-b, b])

    def _default_grid(self) -> int:
        return 2

    @property
    def outputs(self) -> np.ndarray:
        """The debiased values of the two indices, ``[−B, +B]``."""
        return self._table.copy()

    def _release(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        hit = uniform_below_array(rng, self.high + self.low, positions.size) < self.high
        return np.where(hit, positions, 1 - positions)

    def _release_one(self, position: int, rng: np.random.Generator) -> int:
        hit = uniform_below(rng, self.high + self.low) < self.high
        return position if hit else 1 - position

    def exact_probabilities(self, t: Fraction) -> list[Fraction]:
        """``[P(index 0 | t), P(index 1 | t)]`` for a rational t ∈ [−1, 1]."""
        total = self.high + self.low
        plus = (1 + t) / 2 * Fraction(self.high, total) + (1 - t) / 2 * Fraction(self.low, total)
        return [1 - plus, plus]

    def channel_row(self, i: int) -> list[Any]:
        return self.exact_probabilities(Fraction(2 * i - 1))

    def output_probabilities(self, t: Any) -> np.ndarray:
        """``P[index 0 | t], P[index 1 | t]`` as the last axis (shape ``t.shape + (2,)``)."""
        t = check_unit_interval(t, "t")
        p_plus = 0.5 + t / (2 * self.bound)
        return np.stack([1 - p_plus, p_plus], axis=-1)

    def row_moments(self, i: Any) -> tuple[np.ndarray, np.ndarray]:
        x = 2.0 * np.asarray(i, dtype=float) - 1.0
        return x, self.bound**2 - x**2

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        return as_result(self.bound**2 - tt**2, t)

    def worst_case_variance(self) -> float:
        return self.bound**2


def duchi_constant(d: int) -> float:
    """``C_d = 2^{d-1} / binom(d-1, (d-1)/2)`` for odd d and ``C'_d = 2^{d-1} / binom(d-1, d/2)`` for even d.

    Both are ``2^{d-1} / binom(d-1, ⌊d/2⌋)`` and equal ``1 / E[s_j v_j | s ∈ T+]`` (derivation in
    :class:`DuchiMultiDim`). Computed in log space so large d does not overflow.
    """
    d = check_dimension(d)
    log_binom = math.lgamma(d) - math.lgamma(d // 2 + 1) - math.lgamma(d - d // 2)
    return math.exp((d - 1) * math.log(2) - log_binom)


class DuchiMultiDim(VectorMeanMechanism):
    """Duchi et al.'s multi-dimensional mechanism for ``t ∈ [-1, 1]^d`` (SPEC §3.5), exactly ε-LDP for every d.

    1. Round each coordinate: ``v_j = ±1`` with ``P[v_j = 1] = (1 + t_j)/2`` (so ``E[v] = t``).
    2. With probability ``p = H/(H + L)`` (``H/L ≤ e^ε``, :func:`protocols.exact.ratio_weights`; one exact draw)
       report ``z = B s`` for s uniform on ``T+ = {s ∈ {±1}^d : s·v > 0}``,
       otherwise uniform on ``T- = {s·v < 0}``; ``B = C_d (H + L)/(H − L)`` (:func:`duchi_constant`). Released: the
       sign bits of s (1 for +), integers; the signs of s are exact fair bits, the rounding of step 1 only chooses
       the grid input v (:mod:`protocols.exact`), so the channel ``P[s | v]`` below is exact.

    **Even d (ties s·v = 0).** Ties get weight 1/2 in *both* sets: ``P[s | v] ∝`` 1 on strict points, 1/2 on
    ties, so each set has total weight ``(2^d - N_0)/2 + N_0/2 = 2^{d-1}`` (N_0 = #ties) and

        P[s | v] = p / 2^{d-1}  if s·v > 0,   1 / 2^d  if s·v = 0,   (1 - p) / 2^{d-1}  if s·v < 0.

    This is *the same distribution* as padding t with a (d+1)-th coordinate 0 and dropping it from the output
    of the odd-(d+1) mechanism (a tie extends to one strict point of each sign; a strict point to two points of
    its own sign) — and ``C'_d = 2^{d-1}/binom(d-1, d/2) = 2^d/binom(d, d/2) = C_{d+1}``, so B agrees too.

    **Privacy (odd and even d).** ``P[z | t] = Σ_v P[v | t] P[z | v]`` is a convex combination of values in
    ``[(1-p)/2^{d-1}, p/2^{d-1}]``, so ``P[z | t1]/P[z | t2] ≤ p/(1 - p) = e^ε``; equality at
    ``t1 = v``, ``t2 = -v``, ``z = B v`` (vertices make v deterministic). Without a tie rule the claim fails
    for even d (SPEC §3.5); e.g. sampling only strict points of T± gives tie outputs probability 0 under one
    input and > 0 under another (ε = ∞).

    **Unbiasedness.** Write A = #{j : s_j = v_j}, so s·v = 2A - d. Under the weighting on T+ (ties contribute
    0 to 2A - d), by symmetry over coordinates
    ``E[s_j v_j | T+] = Σ_{a > d/2} binom(d, a)(2a - d) / (d 2^{d-1}) = binom(d-1, ⌊d/2⌋)/2^{d-1} = 1/C_d``
    (identity ``Σ_{a>d/2} binom(d,a)(2a-d) = d·binom(d-1, ⌊d/2⌋)``), and ``-1/C_d`` on T-.
    Hence ``E[z | v] = B (2p - 1)/C_d · v = v`` and ``E[z] = t``. Every coordinate of z is ±B, so the per-user
    variance of coordinate j is ``B² - t_j²``.

    **Exact vectorised sampler.** Draw s uniform on ``{±1}^d``; if ``sign(s·v)`` is not the chosen sign, flip s
    (``s ↦ -s`` maps T+ ↔ T- bijectively and fixes the ties). Strict points of the chosen set then have
    probability ``2/2^d`` and ties ``1/2^d`` — exactly the half-weight rule. O(n·d), no rejection, no loops.
    """

    #: Largest d for which :meth:`output_probabilities` enumerates the 2^d outputs.
    MAX_ENUMERATION_D = 10

    def __init__(self, epsilon: float, d: int) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        self.d = check_dimension(d)
        self.high, self.low = ratio_weights(self.epsilon)
        self.p = self.high / (self.high + self.low)
        self.c_d = duchi_constant(self.d)
        self.bound = self.c_d * (self.high + self.low) / (self.high - self.low)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = self._check_values(values)
        rng = check_rng(rng)
        shape = t.shape
        t = t.reshape(-1, self.d)
        n = t.shape[0]
        v = np.where(rng.random(t.shape) < (1 + t) / 2, 1.0, -1.0)
        s = np.where(rng.random(t.shape) < 0.5, 1.0, -1.0)  # exactly 1/2: a double k·2^-53 < 1/2 for half the k
        want = np.where(uniform_below_array(rng, self.high + self.low, n) < self.high, 1.0, -1.0)
        dot = np.einsum("ij,ij->i", s, v)
        flip = np.sign(dot) == -want  # wrong strict side; ties (dot == 0) are never flipped
        s[flip] *= -1.0
        return (s > 0).astype(np.int64).reshape(shape)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        """Released bits (1 for ``+B``, 0 for ``−B``) → ``±B`` per coordinate."""
        return self.bound * (2.0 * self._check_report_rows(reports, 2) - 1.0)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        return as_result(self.bound**2 - tt**2, t)

    def worst_case_variance(self) -> float:
        return self.bound**2

    # ---- exact output distribution (small d), for likelihood-ratio tests -------------------------------------

    def outputs(self) -> np.ndarray:
        """All 2^d possible outputs ``B·s``, shape ``(2^d, d)``; row i has s_j = +1 iff bit j of i is 0."""
        return self.bound * self._signs()

    def _signs(self) -> np.ndarray:
        if self.d > self.MAX_ENUMERATION_D:
            raise ValueError(f"exact enumeration supports d <= {self.MAX_ENUMERATION_D}, got d = {self.d}")
        idx = np.arange(2**self.d)[:, None]
        bits = (idx >> np.arange(self.d)[None, :]) & 1
        return 1.0 - 2.0 * bits

    def conditional_probabilities(self) -> np.ndarray:
        """``P[s | v]`` as a ``(2^d, 2^d)`` matrix (rows v, columns s, both in :meth:`outputs` order)."""
        signs = self._signs()
        dot = signs @ signs.T
        strict = np.where(dot > 0, self.p, 1 - self.p) / 2 ** (self.d - 1)
        return np.where(dot == 0, 1.0 / 2**self.d, strict)

    def output_probabilities(self, t: Any) -> np.ndarray:
        """Exact ``P[z | t]`` over :meth:`outputs`: shape ``(2^d,)`` for one t, ``(m, 2^d)`` for a batch ``(m, d)``.

        ``P[v | t] = Π_j (1 + t_j v_j)/2``, then ``P[z | t] = Σ_v P[v | t] P[z | v]``.
        """
        t = self._check_values(t)
        signs = self._signs()
        p_v = np.prod((1 + t[..., None, :] * signs) / 2, axis=-1)
        return p_v @ self.conditional_probabilities()
