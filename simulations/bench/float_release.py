"""The pre-grid release of PM, Duchi and HM (one value, returning an IEEE double), kept for ``make bench`` only.

This is what devices ran before the exact release (SPEC §3.0): its outputs leak the input through which doubles they
can be (Mironov 2012), so nothing ever sends them; the bench times it beside the released mechanisms, in one run, to
show what exactness costs a device round. Same arithmetic as the old ``privatize_one`` methods.
"""

from __future__ import annotations

import math

import numpy as np

from protocols.numeric import HYBRID_EPSILON_STAR

__all__ = ["FloatHybrid"]


class FloatHybrid:
    """Old HM at ε: PM w.p. α = 1 − e^{−ε/2} (ε > ε*), else Duchi; two or three uniform doubles a report."""

    def __init__(self, epsilon: float) -> None:
        half = math.exp(epsilon / 2)
        self.bound = (half + 1) / (half - 1)
        self.p_inside = half / (half + 1)
        self.alpha = -math.expm1(-epsilon / 2) if epsilon > HYBRID_EPSILON_STAR else 0.0
        self.duchi_bound = (math.exp(epsilon) + 1) / math.expm1(epsilon)

    def piecewise_one(self, t: float, rng: np.random.Generator) -> float:
        left = (self.bound + 1) * t / 2 - (self.bound - 1) / 2
        inside = rng.random() < self.p_inside
        u = rng.random()
        if inside:
            return left + (self.bound - 1) * u
        low = -self.bound + (self.bound + 1) * u
        return low + (self.bound - 1) if low >= left else low

    def duchi_one(self, t: float, rng: np.random.Generator) -> float:
        return self.duchi_bound if rng.random() < 0.5 + t / (2 * self.duchi_bound) else -self.duchi_bound

    def privatize_one(self, t: float, rng: np.random.Generator) -> float:
        return self.piecewise_one(t, rng) if rng.random() < self.alpha else self.duchi_one(t, rng)
