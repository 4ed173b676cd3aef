"""The public bucket grid of a distribution stream: D equal-width buckets over the declared bounds [lo, hi].

Bucket ``j`` (``0 ≤ j < D``) is ``[lo + j·w, lo + (j+1)·w)`` with ``w = (hi - lo)/D``; the last bucket is closed
on the right so that ``hi`` itself falls in bucket ``D - 1``. Values outside [lo, hi] are clipped to the bounds
first (a documented bias, never an error — SPEC §2 step 3). The grid is public: it is part of the round
configuration and independent of any user's data, so bucketising is free post-processing on the device before
the ε-LDP randomizer runs.

``D`` is a power of two by default (``require_power_of_two=True``): HaarHRR needs ``D = 2^L`` leaves and the
hierarchical-interval tree with branching B a power of two then has no padded leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import check_bounds, check_int

__all__ = ["BucketGrid"]

#: Largest grid: the flat unary baseline sends D bits per user and Square Wave's EMS runs a D×D matrix.
MAX_BUCKETS = 1 << 14


class BucketGrid:
    """D buckets over [lo, hi]; maps raw values to buckets (device) and buckets to edges (server)."""

    def __init__(self, lo: float, hi: float, D: int = 64, *, require_power_of_two: bool = True) -> None:
        try:
            lo_f, hi_f = float(lo), float(hi)
        except (TypeError, ValueError):
            raise ValueError(f"bounds must be real numbers, got lo={lo!r}, hi={hi!r}") from None
        try:
            check_bounds(lo_f, hi_f)
        except ValueError:
            raise ValueError(f"bounds must be finite with lo < hi, got lo={lo!r}, hi={hi!r}") from None
        self.D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
        if require_power_of_two and self.D & (self.D - 1):
            raise ValueError(f"D must be a power of two (require_power_of_two=True), got {self.D}")
        self.lo, self.hi = lo_f, hi_f
        self.width = (hi_f - lo_f) / self.D

    def __repr__(self) -> str:
        return f"BucketGrid(lo={self.lo!r}, hi={self.hi!r}, D={self.D})"

    @property
    def edges(self) -> np.ndarray:
        """The D + 1 bucket edges ``lo, lo + w, …, hi``."""
        return np.linspace(self.lo, self.hi, self.D + 1)

    def unit(self, values: Any) -> np.ndarray:
        """Raw values → ``u = (clip(x) - lo)/(hi - lo) ∈ [0, 1]`` (Square Wave's input). NaN is rejected."""
        x = np.asarray(values, dtype=float)
        if x.size and np.isnan(x).any():
            raise ValueError("values must not be NaN")
        return (np.clip(x, self.lo, self.hi) - self.lo) / (self.hi - self.lo)

    def bucket(self, values: Any) -> np.ndarray:
        """Raw values → bucket indices in [0, D) (int64), after clipping to [lo, hi]."""
        return unit_to_bucket(self.unit(values), self.D)


def unit_to_bucket(u: Any, D: int) -> np.ndarray:
    """``u ∈ [0, 1]`` → ``min(⌊u·D⌋, D - 1)`` (the right end 1 belongs to the last bucket)."""
    arr = np.asarray(u, dtype=float)
    if arr.size and not (arr.min() >= 0.0 and arr.max() <= 1.0):
        raise ValueError("unit values must lie in [0, 1]")
    return np.minimum(np.floor(arr * D).astype(np.int64), D - 1)
