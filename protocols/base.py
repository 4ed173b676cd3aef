"""The common interface of every LDP mechanism, and the parameter checks they share.

Conventions (SPEC.md, notation):

* numeric inputs are normalised to ``t ∈ [-1, 1]``; categorical inputs are integers in ``[0, k)``;
* ``variance`` is *per user*: the variance of one user's unbiased contribution. The variance of a population
  estimate over ``n`` users is ``variance / n`` (:func:`confidence_interval` does this);
* ``rng`` is always a :class:`numpy.random.Generator`. Devices create it with :func:`os_rng` (OS entropy);
  simulations and tests pass explicitly seeded generators for reproducibility.

Modelled on IBM diffprivlib's mechanism classes (validated parameters, ``bias``/``variance`` methods) and on
pure-ldp's client/server symmetry (one object both privatizes and aggregates).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "Mechanism",
    "AnalyticMechanism",
    "NumericMechanism",
    "FrequencyOracle",
    "check_epsilon",
    "check_delta",
    "check_int",
    "check_unit_interval",
    "check_bounds",
    "check_categories",
    "check_category",
    "check_unit_value",
    "confidence_interval",
    "normal_half_width",
    "normal_quantile",
    "os_rng",
]


def os_rng() -> np.random.Generator:
    """A generator seeded from OS entropy — the only way devices may create randomness."""
    return np.random.default_rng()


def check_epsilon(epsilon: Any, name: str = "epsilon") -> float:
    """Validate a privacy budget: a finite real number > 0."""
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive real number, got {epsilon!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return value


def check_delta(delta: Any, name: str = "delta", allow_zero: bool = False) -> float:
    """Validate a failure probability δ: in (0, 1), or [0, 1) when ``allow_zero``."""
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number in (0, 1), got {delta!r}") from None
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value < 1):
        bound = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must lie in {bound}, got {delta!r}")
    return value


def check_int(value: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """Validate an integer parameter (domain size, dimension, ...) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}")
    return value


def check_unit_interval(values: Any, name: str = "values") -> np.ndarray:
    """Inputs of numeric mechanisms: finite floats in [-1, 1] (normalise before privatizing)."""
    arr = np.asarray(values, dtype=float)
    if arr.size:
        lo, hi = arr.min(), arr.max()
        if not (lo >= -1.0 and hi <= 1.0):  # also true for NaN (every comparison with NaN is false)
            if not np.isfinite(arr).all():
                raise ValueError(f"{name} must be finite; got NaN or infinity")
            raise ValueError(f"{name} must lie in [-1, 1] (normalise first); got range [{lo:.6g}, {hi:.6g}]")
    return arr


def check_unit_value(value: Any, name: str = "value") -> float:
    """One user's input of a numeric mechanism as a float in [-1, 1]: :func:`check_unit_interval` of one value. A
    Python or numpy real number is checked without numpy's per-call cost (the same messages); anything else goes
    through the batch check, and must be one value."""
    if not isinstance(value, (int, float, np.integer, np.floating)):
        arr = check_unit_interval(np.asarray([value]), name).reshape(-1)
        if arr.size != 1:
            raise ValueError(f"{name} must be one number, got {arr.size} values")
        return float(arr[0])
    t = float(value)
    if not -1.0 <= t <= 1.0:  # also true for NaN
        if not math.isfinite(t):
            raise ValueError(f"{name} must be finite; got NaN or infinity")
        raise ValueError(f"{name} must lie in [-1, 1] (normalise first); got range [{t:.6g}, {t:.6g}]")
    return t


def check_category(value: Any, k: int, name: str = "value") -> int:
    """One user's input of a frequency oracle as an int in [0, k): :func:`check_categories` of one value. A Python
    or numpy integer, or a float64/float32/float16 with an integral value, is checked without numpy's per-call cost
    (the same messages); anything else goes through the batch check, and must be one value."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be integer category indices in [0, {k}), got dtype bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, (float, np.float64, np.float32, np.float16)) and float(value).is_integer():
        v = int(value)  # exact: these floats convert to float without rounding
    else:
        arr = check_categories(np.asarray([value]), k, name).reshape(-1)  # the batch check's errors
        if arr.size != 1:
            raise ValueError(f"{name} must be one category index, got {arr.size} values")
        return int(arr[0])
    if not 0 <= v < k:
        raise ValueError(f"{name} must lie in [0, {k}); got range [{v}, {v}]")
    return v


def check_bounds(lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
    """Declared bounds of numeric values as float arrays: finite, with ``hi > lo`` in every dimension (ValueError
    otherwise). The one bounds check of normalisation, rounding and the simulations."""
    lo_arr = np.asarray(lo, dtype=float)
    hi_arr = np.asarray(hi, dtype=float)
    if not (np.all(np.isfinite(lo_arr)) and np.all(np.isfinite(hi_arr))):
        raise ValueError("bounds lo and hi must be finite")
    if np.any(hi_arr <= lo_arr):
        raise ValueError("bounds need hi > lo in every dimension")
    return lo_arr, hi_arr


def check_categories(values: Any, k: int, name: str = "values") -> np.ndarray:
    """Inputs of frequency oracles: integers in [0, k)."""
    arr = np.asarray(values)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if (not np.issubdtype(arr.dtype, np.floating) or not np.isfinite(arr).all()
                or not np.all(arr == np.round(arr))):  # ±inf equals its rounding but is no category
            raise ValueError(f"{name} must be integer category indices in [0, {k}), got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= k):
        raise ValueError(f"{name} must lie in [0, {k}); got range [{arr.min()}, {arr.max()}]")
    return arr


def normal_quantile(level: float) -> float:
    """z with ``P[|Z| ≤ z] = level`` (two-sided), from the standard library (no scipy on a device)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def normal_half_width(per_user_variance: Any, n: int, level: float = 0.95) -> np.ndarray:
    """The half-width ``z·sqrt(variance/n)`` of the normal-approximation interval of a mean of n i.i.d. terms."""
    z = normal_quantile(level)
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    return z * np.sqrt(np.asarray(per_user_variance, dtype=float) / n)


def confidence_interval(
    estimate: Any, per_user_variance: Any, n: int, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Normal-approximation interval ``estimate ± z·sqrt(variance/n)`` (the estimators are sums of n i.i.d. terms;
    :func:`normal_half_width`)."""
    half = normal_half_width(per_user_variance, n, level)
    est = np.asarray(estimate, dtype=float)
    return est - half, est + half


class Mechanism(ABC):
    """An ε-LDP (or (ε, δ)-LDP) randomizer together with its aggregator.

    Attributes:
        epsilon: the exact privacy guarantee of one call of ``privatize`` on one user's value.
        delta: 0 for pure ε-LDP mechanisms.
    """

    epsilon: float
    delta: float = 0.0

    @abstractmethod
    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Randomize one value per user (vectorised over the first axis)."""

    @abstractmethod
    def estimate(self, reports: np.ndarray) -> Any:
        """Population estimate from the users' reports."""

    def privatize_one(self, value: Any, rng: np.random.Generator) -> Any:
        """One user's report row: ``privatize([value], rng)[0]``, drawing the same random numbers in the same order
        (so every exact likelihood ratio and audit of :meth:`privatize` holds for it; tested for equality on shared
        seeds). A device privatizes one value at a time, where numpy's per-call cost dominates a batch of one: the
        mechanisms a device runs most override it with scalar arithmetic (returning Python numbers where the batch
        has numpy scalars; the encoded report is the same). A subclass that changes :meth:`privatize` must change
        this too: tests/protocols/test_catalogue.py checks the equality for every catalogued stream mechanism."""
        return np.asarray(self.privatize(np.asarray(value)[None], rng))[0]

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"

    def _params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": self.epsilon}
        if self.delta:
            out["delta"] = self.delta
        return out


class AnalyticMechanism(Mechanism):
    """A mechanism whose estimator is unbiased with a closed-form per-user variance: the numeric mechanisms, the
    frequency oracles, HaarHRR and the analytic distribution mechanisms. Square Wave + EMS (a biased estimator
    with no closed-form variance) is a plain :class:`Mechanism`: whether a mechanism has an analytic variance is
    whether it is an ``AnalyticMechanism``."""

    @abstractmethod
    def estimate(self, reports: np.ndarray) -> Any:
        """Unbiased population estimate from the users' reports."""

    @abstractmethod
    def variance(self, *args: Any, **kwargs: Any) -> Any:
        """Analytic per-user variance of the unbiased estimator (see module docstring)."""

    def bias(self, *args: Any, **kwargs: Any) -> float:
        """The estimator is unbiased (consistency post-processing is separate)."""
        return 0.0


class NumericMechanism(AnalyticMechanism):
    """Mean estimation for inputs in [-1, 1].

    ``privatize(t, rng)`` returns one report per user; ``debias(reports)`` maps reports to per-user unbiased
    estimates of t (identity for mechanisms whose outputs are already unbiased); ``estimate`` is their mean.
    """

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return np.asarray(reports, dtype=float)

    def estimate(self, reports: np.ndarray) -> float:
        values = self.debias(reports)
        if values.size == 0:
            raise ValueError("cannot estimate a mean from zero reports")
        return float(values.mean(axis=0)) if values.ndim == 1 else values.mean(axis=0)

    @abstractmethod
    def variance(self, t: Any = 0.0) -> Any:
        """Per-user variance of ``debias(privatize(t))`` at input ``t``."""

    def worst_case_variance(self) -> float:
        """max over t ∈ [-1, 1] of ``variance(t)`` (on a fine grid; subclasses may give the closed form)."""
        grid = np.linspace(-1.0, 1.0, 2001)
        return float(np.max(self.variance(grid)))


class FrequencyOracle(AnalyticMechanism):
    """Frequency estimation over the domain ``[0, k)``.

    Pure oracles have per-report support probabilities ``p`` (the true value is supported) and ``q`` (any other
    value is); the unbiased estimator of the fraction of users holding ``v`` is
    ``f̂_v = (C_v / n - q) / (p - q)`` with ``C_v`` the number of reports supporting ``v`` (SPEC §3.8).
    """

    k: int
    p: float
    q: float

    @abstractmethod
    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """C_v for every v in [0, k): how many reports support v (vectorised, no per-user Python loop)."""

    @abstractmethod
    def n_reports(self, reports: np.ndarray) -> int:
        """Number of users represented by ``reports``."""

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        return self.estimate_counts(self.support_counts(reports), self.n_reports(reports))

    def estimate_counts(self, counts: Any, n: int) -> np.ndarray:
        """``f̂_v = (C_v/n − q)/(p − q)`` from the support counts of n reports: the counts and n are the oracle's
        sufficient statistics (additive over reports, so a coordinator keeps them as reports arrive)."""
        if n <= 0:
            raise ValueError("cannot estimate frequencies from zero reports")
        return (np.asarray(counts, dtype=float) / n - self.q) / (self.p - self.q)

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of f̂_v at true frequency f: ``(q(1-q) + f(p-q)(1-p-q)) / (p-q)^2``.

        Divide by n for the variance of the estimate over n users. At f=0 this is the usual ``q(1-q)/(p-q)^2``.
        """
        f = np.asarray(f, dtype=float)
        p, q = self.p, self.q
        return (q * (1 - q) + f * (p - q) * (1 - p - q)) / (p - q) ** 2

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "k": self.k}
