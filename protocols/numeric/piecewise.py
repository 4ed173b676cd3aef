"""Piecewise mechanism (PM) and Hybrid mechanism (HM) of Wang et al. (SPEC §3.2, §3.3).

Reference: N. Wang, X. Xiao, Y. Yang, J. Zhao, S. C. Hui, H. Shin, J. Shin, G. Yu, *Collecting and Analyzing
Multidimensional Data with Local Differential Privacy*, ICDE 2019 (Algorithm 2 = PM, Sec. III-C = HM).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import NumericMechanism, check_unit_interval, check_unit_value

from ._common import as_result, check_bounded_epsilon, check_reports, check_rng
from .duchi import Duchi

__all__ = ["Piecewise", "Hybrid", "HYBRID_EPSILON_STAR"]

#: ε* of Wang et al. (ICDE'19, Sec. III-C): below it HM is pure Duchi (α = 0), above it α = 1 - e^{-ε/2}.
#: ε* = ln((-5 + 2∛(6353 - 405√241) + 2∛(6353 + 405√241)) / 27) ≈ 0.6094.
HYBRID_EPSILON_STAR = math.log(
    (-5 + 2 * math.cbrt(6353 - 405 * math.sqrt(241)) + 2 * math.cbrt(6353 + 405 * math.sqrt(241))) / 27
)


class Piecewise(NumericMechanism):
    """Piecewise mechanism: output in ``[-C, C]``, ``C = (e^{ε/2} + 1)/(e^{ε/2} - 1)``.

    ``l(t) = (C + 1)t/2 - (C - 1)/2``, ``r(t) = l(t) + C - 1``. With probability ``e^{ε/2}/(e^{ε/2} + 1)`` the
    output is uniform on ``[l, r]`` (density ``p_hi = e^{ε/2}(e^{ε/2} - 1)/(2(e^{ε/2} + 1))``), otherwise uniform
    on ``[-C, l) ∪ (r, C]`` (length C + 1, density ``p_lo = p_hi / e^ε``). The support ``[-C, C]`` does not
    depend on t, and the density only takes the values p_hi and p_lo, so ``sup_y f(y|t1)/f(y|t2) = e^ε``
    (attained on ``[l(t1), r(t1)] \\ [l(t2), r(t2)]``).

    Unbiased as is; ``Var(t) = t²/(e^{ε/2} - 1) + (e^{ε/2} + 3)/(3(e^{ε/2} - 1)²)``, maximal at |t| = 1.
    """

    def __init__(self, epsilon: float) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        half = math.exp(self.epsilon / 2)
        self._half = half
        self.bound = (half + 1) / (half - 1)
        self.p_inside = half / (half + 1)
        self.density_high = self.p_inside / (self.bound - 1)
        self.density_low = self.density_high / math.exp(self.epsilon)

    def interval(self, t: Any) -> tuple[np.ndarray, np.ndarray]:
        """The high-probability interval ``[l(t), r(t)]``."""
        t = check_unit_interval(t, "t")
        left = (self.bound + 1) * t / 2 - (self.bound - 1) / 2
        return left, left + self.bound - 1

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """Density of the output y given input t (broadcasting); ``[l, r]`` counted as the high part."""
        left, right = self.interval(t)
        y = np.asarray(y, dtype=float)
        inside = (y >= left) & (y <= right)
        density = np.where(inside, self.density_high, self.density_low)
        return np.where(np.abs(y) <= self.bound, density, 0.0)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        rng = check_rng(rng)
        left, _ = self.interval(t)
        inside = rng.random(t.shape) < self.p_inside
        u = rng.random(t.shape)
        high = left + (self.bound - 1) * u
        low = -self.bound + (self.bound + 1) * u  # uniform on [-C, 1), then skip over [l, r]
        low = np.where(low >= left, low + (self.bound - 1), low)
        return np.where(inside, high, low)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> float:
        t = check_unit_value(value)
        rng = check_rng(rng)
        left = (self.bound + 1) * t / 2 - (self.bound - 1) / 2
        inside = rng.random() < self.p_inside
        u = rng.random()
        if inside:
            return left + (self.bound - 1) * u
        low = -self.bound + (self.bound + 1) * u
        return low + (self.bound - 1) if low >= left else low

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return check_reports(reports, self.bound)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        e = self._half - 1
        return as_result(tt**2 / e + (self._half + 3) / (3 * e**2), t)

    def worst_case_variance(self) -> float:
        return float(self.variance(1.0))


class Hybrid(NumericMechanism):
    """Hybrid mechanism: PM with probability α, Duchi 1-D otherwise, both at the full ε.

    ``α = 1 - e^{-ε/2}`` if ε > ε* ≈ 0.6094 (:data:`HYBRID_EPSILON_STAR`), else ``α = 0`` (Wang et al.'s
    choice, minimising the worst-case variance). Both parts are ε-LDP and unbiased, so the mixture is too:
    the output law is ``α·PM(t) + (1-α)·Duchi(t)``, an absolutely continuous part (density α·PM-pdf, see
    :meth:`pdf`) plus atoms at ±B (probabilities (1-α)·Duchi-pmf, see :meth:`atom_probabilities`), and the
    likelihood ratio of each part is bounded by e^ε separately.

    ``Var(t) = α·Var_PM(t) + (1-α)·(B² - t²)`` (mixture of unbiased estimators); it is linear in t², so the
    worst case is at t = 0 or |t| = 1.
    """

    def __init__(self, epsilon: float) -> None:
        self.epsilon = check_bounded_epsilon(epsilon)
        self.delta = 0.0
        self.alpha = -math.expm1(-self.epsilon / 2) if self.epsilon > HYBRID_EPSILON_STAR else 0.0
        self.piecewise = Piecewise(self.epsilon)
        self.duchi = Duchi(self.epsilon)
        self.bound = self.piecewise.bound if self.alpha > 0 else self.duchi.bound

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """Density of the absolutely continuous part: ``α · PM.pdf(t, y)`` (the atoms are separate)."""
        return self.alpha * self.piecewise.pdf(t, y)

    def atom_probabilities(self, t: Any) -> np.ndarray:
        """Probabilities of the atoms ``[-B, +B]`` (Duchi's outputs): ``(1 - α)·Duchi.output_probabilities(t)``."""
        return (1 - self.alpha) * self.duchi.output_probabilities(t)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        rng = check_rng(rng)
        flat = t.reshape(-1)
        use_pm = rng.random(flat.shape) < self.alpha
        out = np.empty(flat.shape, dtype=float)
        n_pm = int(np.count_nonzero(use_pm))
        if n_pm:  # an empty part draws nothing: skipping it changes no random stream (one user: one part)
            out[use_pm] = self.piecewise.privatize(flat[use_pm], rng)
        if n_pm < flat.size:
            out[~use_pm] = self.duchi.privatize(flat[~use_pm], rng)
        return out.reshape(t.shape)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> float:
        t = check_unit_value(value)
        part = self.piecewise if check_rng(rng).random() < self.alpha else self.duchi
        return part.privatize_one(t, rng)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return check_reports(reports, self.bound)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        var = self.alpha * self.piecewise.variance(tt) + (1 - self.alpha) * self.duchi.variance(tt)
        return as_result(np.asarray(var), t)

    def worst_case_variance(self) -> float:
        return float(max(self.variance(0.0), self.variance(1.0)))
