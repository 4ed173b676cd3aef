"""NEGATIVE CONTROLS — the double-releasing PM and Laplace haarvest shipped before the exact release (SPEC §3.0).

Kept only so the float-structure audit (protocols.audit.float_reachable) has something it must catch, like the
thesis's GPM and PDP in thesis_controls.py. Each is given as its branches ``release(x, u)``, monotone in the uniform
double u, exactly as the old code computed them (Wang et al.'s PM at ε; local Laplace by inversion of u). Never use
them to release anything.
"""

from __future__ import annotations

import math

import numpy as np


def float_piecewise(epsilon: float):
    """The old PM: ``(privatize(x, rng), branches)``."""
    half = math.exp(epsilon / 2)
    bound = (half + 1) / (half - 1)
    p_inside = half / (half + 1)

    def left(x: float) -> float:
        return (bound + 1) * x / 2 - (bound - 1) / 2

    def inside(x: float, u: float) -> float:
        return left(x) + (bound - 1) * u

    def outside(x: float, u: float) -> float:
        low = -bound + (bound + 1) * u
        return low + (bound - 1) if low >= left(x) else low

    def privatize(x: float, rng: np.random.Generator) -> float:
        branch = inside if rng.random() < p_inside else outside
        return branch(x, rng.random())

    return privatize, (inside, outside)


def float_laplace(epsilon: float):
    """The old local Laplace ``x + Lap(2/ε)``, by inversion: u < 1/2 gives the left tail, u ≥ 1/2 the right."""
    scale = 2.0 / epsilon

    def left(x: float, u: float) -> float:  # u in (0, 1/2): x + λ·ln(2u), increasing in u
        return x + scale * math.log(2 * max(u, 2.0**-60)) if u < 0.5 else x

    def right(x: float, u: float) -> float:  # u in [1/2, 1): x − λ·ln(2 − 2u), increasing in u
        return x - scale * math.log(2 - 2 * u) if u >= 0.5 else x

    def privatize(x: float, rng: np.random.Generator) -> float:
        u = rng.random()
        return (left if u < 0.5 else right)(x, u)

    return privatize, (left, right)
