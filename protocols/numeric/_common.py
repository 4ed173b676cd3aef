"""Helpers shared by the numeric mechanisms: argument checks, scalar/array results, the vector base class."""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import NumericMechanism, check_epsilon, check_int, check_unit_interval
from protocols.errors import OffGridError

__all__ = [
    "MAX_EPSILON",
    "check_rng",
    "check_indices",
    "check_dimension",
    "check_bounded_epsilon",
    "as_result",
    "VectorMeanMechanism",
]

#: Largest ε accepted by mechanisms whose probabilities involve e^ε: beyond it 1/(e^ε + 1) < 2e-22 and the
#: exact-ratio arithmetic (and e^ε itself, past ε ≈ 709) breaks down; such a budget protects nothing anyway.
MAX_EPSILON = 20.0  # beyond ~36, 1/(e^ε+1) underflows double precision and outputs become deterministic


def check_bounded_epsilon(epsilon: Any) -> float:
    """:func:`protocols.base.check_epsilon` plus ``ε ≤`` :data:`MAX_EPSILON`."""
    value = check_epsilon(epsilon)
    if value > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON:g} for this mechanism, got {epsilon!r}")
    return value


def check_rng(rng: Any) -> np.random.Generator:
    """``rng`` must be a :class:`numpy.random.Generator` (devices: ``protocols.base.os_rng()``)."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_indices(reports: Any, size: int, name: str = "reports") -> np.ndarray:
    """Released values as int64 grid indices in ``[0, size)`` (SPEC §3.0); OffGridError otherwise — a real number is a
    report of a release format no current device sends (raw doubles, refused), an integer outside the range is off
    the grid."""
    arr = np.asarray(reports)
    if arr.size and arr.dtype.kind not in "iu":
        raise OffGridError(f"{name} must be grid indices (integers in [0, {size})), got {arr.dtype} values: "
                           "a real-valued report is the old raw-double release, refused")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= size):
        raise OffGridError(f"{name} are off the grid: indices must lie in [0, {size}), got "
                           f"[{int(arr.min())}, {int(arr.max())}]")
    return arr.astype(np.int64, copy=False)


def as_result(value: np.ndarray, like: Any) -> Any:
    """Return a Python float when the caller passed a scalar, else the array."""
    return float(value) if np.ndim(like) == 0 else value


class VectorMeanMechanism(NumericMechanism):
    """Mean estimation for vectors in ``[-1, 1]^d``: one report row of length ``d`` per user.

    ``privatize`` takes ``(n, d)`` (or one user's ``(d,)``) and returns the same shape; ``estimate`` returns the
    ``(d,)`` vector of per-coordinate unbiased means; ``variance(t)`` is elementwise in the coordinates
    ``t_j`` (the per-user variance of coordinate ``j`` of the debiased report when that coordinate is ``t_j``).
    Distinct from scalar :class:`~protocols.base.NumericMechanism` objects by ``isinstance`` and by ``d``.
    """

    d: int

    def _check_values(self, values: Any) -> np.ndarray:
        arr = check_unit_interval(values)
        if arr.ndim == 0 or arr.shape[-1] != self.d:
            raise ValueError(f"values must have shape (n, {self.d}) (one row per user); got shape {arr.shape}")
        return arr

    def _check_report_rows(self, reports: Any, size: int) -> np.ndarray:
        """Released rows: shape ``(n, d)`` (or one ``(d,)``) of grid indices in ``[0, size)`` (:func:`check_indices`)."""
        arr = np.asarray(reports)
        if arr.ndim == 0 or arr.shape[-1] != self.d:
            raise ValueError(f"reports must have shape (n, {self.d}); got shape {arr.shape}")
        return check_indices(arr, size)

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        """Per-coordinate mean of the debiased reports: shape ``(d,)``."""
        values = self.debias(reports).reshape(-1, self.d)
        if values.shape[0] == 0:
            raise ValueError("cannot estimate a mean from zero reports")
        return values.mean(axis=0)

    def worst_case_variance(self) -> float:
        """max over t_j ∈ [-1, 1] of the per-coordinate variance (the variance is elementwise in t_j)."""
        grid = np.linspace(-1.0, 1.0, 2001)
        return float(np.max(self.variance(grid)))

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "d": self.d}


def check_dimension(d: Any) -> int:
    return check_int(d, "d", 1)
