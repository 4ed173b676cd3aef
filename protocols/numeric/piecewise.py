"""Piecewise mechanism (PM) and Hybrid mechanism (HM) of Wang et al. (SPEC §3.2, §3.3).

Reference: N. Wang, X. Xiao, Y. Yang, J. Zhao, S. C. Hui, H. Shin, J. Shin, G. Yu, *Collecting and Analyzing
Multidimensional Data with Local Differential Privacy*, ICDE 2019 (Algorithm 2 = PM, Sec. III-C = HM).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fractions import Fraction

from protocols.base import check_unit_interval, check_unit_value
from protocols.exact import uniform_below, uniform_below_array

from ._common import check_bounded_epsilon, check_rng
from ._grid import DEFAULT_GRID, GridMechanism, WindowMechanism, check_grid
from .duchi import Duchi

__all__ = ["Piecewise", "Hybrid", "HYBRID_EPSILON_STAR", "piecewise_continuous_variance"]

#: ε* of Wang et al. (ICDE'19, Sec. III-C): below it HM is pure Duchi (α = 0), above it α = 1 - e^{-ε/2}.
#: ε* = ln((-5 + 2∛(6353 - 405√241) + 2∛(6353 + 405√241)) / 27) ≈ 0.6094.
HYBRID_EPSILON_STAR = math.log(
    (-5 + 2 * math.cbrt(6353 - 405 * math.sqrt(241)) + 2 * math.cbrt(6353 + 405 * math.sqrt(241))) / 27
)


class Piecewise(WindowMechanism):
    """Piecewise mechanism on a grid (Wang et al.'s PM, released exactly; SPEC §3.3 and §3.0).

    The continuous PM outputs ``y ∈ [−C, C]``, ``C = (e^{ε/2} + 1)/(e^{ε/2} − 1)``, with density e^ε times higher on a
    window ``[l(t), r(t)]`` of length ``C − 1`` than elsewhere. Released exactly: the support is ``grid`` cells, the
    window ``K ≈ grid·(C − 1)/(2C)`` cells, its start the input's randomized rounding to ``s ∈ {0, …, grid − K}``,
    and the cell is drawn from the :class:`~protocols.exact.WindowChannel` — weight H on the window, L elsewhere,
    ``H/L ≤ e^ε``, the same total for every s. So ``P[j|s]/P[j|s'] ≤ H/L ≤ e^ε`` on the released indices (enumerated
    in tests). ``debias(j)`` is affine in j and exactly unbiased; its range is ≈ ``[−C, C]``.

    Variance: exact on the grid (:meth:`GridMechanism.variance`); the continuous law's
    ``t²/(e^{ε/2} − 1) + (e^{ε/2} + 3)/(3(e^{ε/2} − 1)²)`` (:func:`piecewise_continuous_variance`) within 0.05 %
    at the default grid for ε ∈ [0.1, 4] (asserted in tests/protocols/numeric/test_grid.py).
    """

    def __init__(self, epsilon: float, grid: int = DEFAULT_GRID) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        half = math.exp(self.epsilon / 2)
        self.continuous_bound = (half + 1) / (half - 1)
        self._setup_window(self.epsilon, check_grid(grid, 16), (self.continuous_bound - 1) / (2 * self.continuous_bound))


def piecewise_continuous_variance(epsilon: float, t: Any) -> Any:
    """The continuous PM's variance ``t²/(e^{ε/2} − 1) + (e^{ε/2} + 3)/(3(e^{ε/2} − 1)²)`` (Wang et al., Lemma 1)."""
    e = math.exp(epsilon / 2) - 1
    return np.asarray(t, dtype=float) ** 2 / e + (e + 4) / (3 * e**2)


#: Precision of Hybrid's mixing weight α (a multiple of 2^-32, drawn exactly).
_ALPHA_BITS = 32


class Hybrid(GridMechanism):
    """Hybrid mechanism: PM with probability α, Duchi 1-D otherwise, both at the full ε (Wang et al., Sec. III-C).

    ``α ≈ 1 − e^{−ε/2}`` (a multiple of 2^-32, drawn exactly) if ε > ε* ≈ 0.6094 (:data:`HYBRID_EPSILON_STAR`), else
    0. Released indices: ``[0, grid − 2)`` are the PM part's cells (:class:`Piecewise` with ``grid − 2`` cells),
    ``grid − 2`` and ``grid − 1`` Duchi's ``−B`` and ``+B``. The two parts' indices are disjoint and the mixing weight
    does not depend on the input, so every index's likelihood ratio is one part's: ``≤ e^ε``. Both parts are
    unbiased, so the mixture is; ``Var = α·(Var_PM + t²) + (1 − α)·B² − t²`` (exact on the grid)."""

    def __init__(self, epsilon: float, grid: int = DEFAULT_GRID) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        self.grid = check_grid(grid, 18)
        alpha = -math.expm1(-self.epsilon / 2) if self.epsilon > HYBRID_EPSILON_STAR else 0.0
        self._alpha_num = round(alpha * (1 << _ALPHA_BITS))
        self.alpha = self._alpha_num / (1 << _ALPHA_BITS)
        self.piecewise = Piecewise(self.epsilon, grid=self.grid - 2)
        self.duchi = Duchi(self.epsilon)
        self.inputs = self.piecewise.inputs

    def _estimates(self) -> np.ndarray:
        return np.concatenate([self.piecewise._estimates(), self.duchi._table])

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        rng = check_rng(rng)
        flat = t.reshape(-1)
        use_pm = uniform_below_array(rng, 1 << _ALPHA_BITS, flat.size) < self._alpha_num
        out = np.empty(flat.shape, dtype=np.int64)
        n_pm = int(np.count_nonzero(use_pm))
        if n_pm:  # an empty part draws nothing: skipping it changes no random stream (one user: one part)
            out[use_pm] = self.piecewise.privatize(flat[use_pm], rng)
        if n_pm < flat.size:
            out[~use_pm] = self.duchi.privatize(flat[~use_pm], rng) + (self.grid - 2)
        return out.reshape(t.shape)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> int:
        t = check_unit_value(value)
        if uniform_below(check_rng(rng), 1 << _ALPHA_BITS) < self._alpha_num:
            return self.piecewise.privatize_one(t, rng)
        return self.duchi.privatize_one(t, rng) + self.grid - 2

    def channel_row(self, i: int) -> list[Any]:
        alpha = Fraction(self._alpha_num, 1 << _ALPHA_BITS)
        x = Fraction(2 * i, self.inputs - 1) - 1
        duchi = self.duchi.exact_probabilities(x)
        return [alpha * p for p in self.piecewise.channel_row(i)] + [(1 - alpha) * p for p in duchi]

    def atom_probabilities(self, t: Any) -> np.ndarray:
        """Probabilities of the Duchi indices ``[grid − 2, grid − 1]``: ``(1 − α)·Duchi.output_probabilities(t)``."""
        return (1 - self.alpha) * self.duchi.output_probabilities(t)

    def row_moments(self, i: Any) -> tuple[np.ndarray, np.ndarray]:
        x, v_pm = self.piecewise.row_moments(i)
        second = self.alpha * (v_pm + x**2) + (1 - self.alpha) * self.duchi.bound**2
        return x, second - x**2
