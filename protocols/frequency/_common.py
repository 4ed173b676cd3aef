"""Input checks and numerically stable probabilities shared by the frequency oracles (private helpers)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import check_categories, check_epsilon

#: Largest supported ε. Samplers compare float64 uniforms (granularity 2^-53 ≈ e^{-36.7}) with the flip
#: probabilities, which realises a probability of order e^{-ε} only up to a relative error 2^-53·e^ε (5e-8 at
#: ε = 20, 1e-3 at ε = 30); beyond 20 the stated ε would no longer be exact. LDP deployments use ε ≤ 10.
MAX_EPSILON = 20.0


def oracle_epsilon(epsilon: Any) -> float:
    """:func:`protocols.base.check_epsilon` plus the upper limit :data:`MAX_EPSILON`."""
    value = check_epsilon(epsilon)
    if value > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON:g} for frequency oracles (exact sampling), got {epsilon!r}")
    return value


def user_values(values: Any, k: int) -> np.ndarray:
    """One category index per user: a 0-d or 1-D array of integers in [0, k), returned as 1-D int64."""
    arr = check_categories(values, k)
    if arr.ndim > 1:
        raise ValueError(f"values must be a 1-D array (one category per user), got shape {arr.shape}")
    return arr.reshape(-1)


def report_matrix(reports: Any, columns: int, name: str = "reports") -> np.ndarray:
    """A 2-D integer report array with ``columns`` columns (one row per user)."""
    arr = np.asarray(reports)
    if arr.ndim != 2 or arr.shape[1] != columns:
        raise ValueError(f"{name} must have shape (n, {columns}), got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_:
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr


def report_vector(reports: Any, upper: int, name: str = "reports") -> np.ndarray:
    """A 1-D int64 report array with entries in [0, upper)."""
    arr = np.asarray(reports)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array (one report per user), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        raise ValueError(f"{name} must lie in [0, {upper}); got range [{arr.min()}, {arr.max()}]")
    return arr


def keep_probability(epsilon: float, others: int) -> tuple[float, float]:
    """GRR over ``others + 1`` outputs: ``(e^ε/(e^ε+others), 1/(e^ε+others))``, computed without overflow."""
    t = math.exp(-epsilon)  # e^{-ε} ∈ (0, 1): no overflow for any finite ε
    p = 1.0 / (1.0 + others * t)
    q = t / (1.0 + others * t)
    return p, q
