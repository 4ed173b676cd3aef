"""Volatility detection and adaptive α-point rounding on the device (SPEC §2.1–2.2).

**Volatility (SPEC §2.1).** For dimension j with declared bounds [lo_j, hi_j] and a window holding the W + 1 most
recent values v_0..v_W (so W consecutive differences, t = 1..W in the SPEC formula):

    score_j = Σ_{t=1..W} |v_{j,t} - v_{j,t-1}| / (W · (hi_j - lo_j))  ∈ [0, 1]

(values are clipped to the bounds first, so the score stays in [0, 1]). Convention: the score is the *mean*
absolute step over the differences the window holds; during warm-up (fewer than W + 1 values seen) it is the
mean over the differences available, and 0 with fewer than two values. Dimension j is volatile iff
``score_j > τ``.

**α-point rounding (SPEC §2.2; Ding, Kulkarni, Yekhanin, NeurIPS 2017 "Collecting telemetry data privately").**
Each device draws once per dimension, for life, ``u_j ~ U[0, 1)`` and uses ``α_j = u_j·step_j``. With the grid
anchored at lo (points lo + i·step), L the grid point at or below x and R = L + step: output L if
``x + α < R`` else R. Equivalently the grid index is ``⌊(x - lo)/step + u⌋``. Over the randomness of u,
``P[R] = (x - L)/step``, so ``E[y] = x`` and ``E[(y - x)²] = (R - x)(x - L)``. Since u is fixed for life, a value
that jitters inside one cell without crossing ``L + (1 - u)·step`` keeps its rounded value — the memo key
(built from the integer grid index) then repeats and memoization costs no further budget.

**Steps (SPEC §2.2, production correction).** ``step_j = (hi_j - lo_j)·max(1/K_base, score_j/η)``, quantised
*up* to ``(hi_j - lo_j)/K_base · 2^m`` (integer m ≥ 0, capped at ``⌊log2 K_base⌋`` so step ≤ hi - lo). Grids with
different m nest (every point of the coarser grid is a point of the finer one). Steps are recomputed only at
epoch boundaries (:class:`EpochSteps`).

**The device's order** (per reading, after clipping): update the window, take the epoch plan (:func:`epoch_plan`:
none until the first window is full), round the volatile dimensions (:meth:`AlphaRounder.round_in_bounds`) —
:func:`round_reading`, which the edge agent (:mod:`edge_agent.rounding_state`, per dimension) and the fleet simulator
(:mod:`simulations.fleet_pipeline`, a fleet at once) both call.

Rounded values lie in [lo, hi + step): when step does not divide hi - lo the top cell reaches past hi, and
clipping the output back to the bounds (normalisation, SPEC §2.3) biases values in that last cell only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.base import check_bounds

__all__ = [
    "volatility_score",
    "VolatilityDetector",
    "quantise_step",
    "quantised_step",
    "quantised_exponent",
    "AlphaRounder",
    "EpochSteps",
    "EpochPlan",
    "epoch_plan",
    "RoundedReading",
    "round_reading",
]


def _finite(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.size and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; got NaN or infinity")
    return arr


def volatility_score(window: Any, lo: Any, hi: Any) -> np.ndarray:
    """``Σ|v_t - v_{t-1}| / (W·(hi - lo))`` along axis 0 of ``window`` (W + 1 values → W differences).

    ``window`` has shape (W+1,) or (W+1, d) (any trailing shape broadcasting with lo/hi); values are clipped to
    [lo, hi] first, so scores lie in [0, 1]. Fewer than two values give 0.
    """
    lo_arr, hi_arr = check_bounds(lo, hi)
    w = _finite(window, "window")
    if w.ndim == 0:
        raise ValueError("window must have at least one axis (time along axis 0)")
    return _score(w, lo_arr, hi_arr)


def _score(w: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`volatility_score` of a checked window and bounds."""
    if w.shape[0] < 2:
        return np.zeros(np.broadcast_shapes(w.shape[1:], lo.shape, hi.shape))
    w = np.clip(w, lo, hi)
    # summed along a contiguous time axis for every layout, so a dimension's score is the same number whether its
    # window is held alone (a device: one detector per dimension) or beside others (the fleet simulator's n·d
    # columns); numpy's sum over axis 0 of a wide array adds in another order and can differ in the last bit
    diffs = np.abs(np.diff(w, axis=0))
    diffs = diffs.T if diffs.ndim == 2 else np.moveaxis(diffs, 0, -1)  # time last (.T: the same, without overhead)
    steps = np.add.reduce(np.ascontiguousarray(diffs), axis=-1)
    return steps / ((w.shape[0] - 1) * (hi - lo))


class VolatilityDetector:
    """Sliding window (RAM only) of the last W + 1 values of each of d dimensions; volatile iff score > τ.

    ``update(x)`` appends one record x of shape (d,) and returns the boolean mask of volatile dimensions;
    ``push(x)`` appends it only. The scores are computed when asked for (:attr:`scores`, :attr:`volatile`), at most
    once per window state: :func:`epoch_plan` asks when it makes a new epoch's plan (or tries to, for a reading
    behind a restored plan), not for every reading of an epoch.
    """

    def __init__(self, lo: Any, hi: Any, window: int = 16, tau: float = 0.01) -> None:
        lo_arr, hi_arr = check_bounds(lo, hi)
        lo_arr, hi_arr = np.broadcast_arrays(np.atleast_1d(lo_arr), np.atleast_1d(hi_arr))
        if lo_arr.ndim != 1:
            raise ValueError("lo and hi must be scalars or 1-D arrays (one entry per dimension)")
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        tau = float(tau)
        if not (math.isfinite(tau) and 0 <= tau < 1):
            raise ValueError(f"tau must lie in [0, 1), got {tau}")
        self.lo = lo_arr.astype(float)
        self.hi = hi_arr.astype(float)
        self.window = int(window)
        self.tau = tau
        self.d = self.lo.size
        #: the window in time order, oldest first: rows [0, count) hold values; once full, each update shifts it
        self._buffer = np.zeros((self.window + 1, self.d))
        self._count = 0  # values seen (saturates the window at W + 1)
        self._scores: np.ndarray | None = np.zeros(self.d)  # None: not computed since the last push

    def update(self, x: Any) -> np.ndarray:
        """Add one record (shape (d,)); return ``scores > tau``."""
        self.push(x)
        return self.volatile

    def push(self, x: Any) -> None:
        """Add one record (shape (d,)) to the window."""
        arr = _finite(x, "x").reshape(-1)
        if arr.size != self.d:
            raise ValueError(f"expected a record of {self.d} values, got {arr.size}")
        if self._count <= self.window:
            self._buffer[self._count] = arr
            self._count += 1
        else:  # drop the oldest value (an overlapping copy, which numpy makes correctly)
            self._buffer[:-1] = self._buffer[1:]
            self._buffer[-1] = arr
        self._scores = None

    def _current_scores(self) -> np.ndarray:
        if self._scores is None:
            self._scores = _score(self._buffer[: self._count], self.lo, self.hi)  # bounds checked once, in __init__
        return self._scores

    @property
    def count(self) -> int:
        """Values the window holds (at most W + 1)."""
        return self._count

    def values(self) -> np.ndarray:
        """The window in time order, shape (count, d), oldest first."""
        return self._buffer[: self._count].copy()

    @property
    def scores(self) -> np.ndarray:
        return self._current_scores().copy()

    @property
    def volatile(self) -> np.ndarray:
        return self._current_scores() > self.tau


def _check_k_eta(k_base: Any, eta: Any) -> tuple[int, float]:
    if isinstance(k_base, bool) or not isinstance(k_base, (int, np.integer)) or k_base < 1:
        raise ValueError(f"k_base must be an integer >= 1, got {k_base!r}")
    eta = float(eta)
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be a finite number > 0, got {eta}")
    return int(k_base), eta


def quantised_exponent(score: Any, k_base: int = 100, eta: float = 0.1) -> np.ndarray:
    """m ≥ 0 with step = (hi-lo)/K_base·2^m: ``m = ⌈log2 max(1, score·K_base/η)⌉``, capped at ⌊log2 K_base⌋."""
    k_base, eta = _check_k_eta(k_base, eta)
    s = _finite(score, "score")
    if s.size and s.min() < 0:
        raise ValueError("volatility scores must be >= 0")
    return _nested_exponent(s * k_base / eta, k_base)


def _nested_exponent(ratio: Any, k_base: int) -> np.ndarray:
    """The nested grid's exponent for a step of ``ratio`` finest steps: ``m = ⌈log2 max(1, ratio)⌉`` capped at
    ⌊log2 K_base⌋ (so a step never exceeds hi - lo); the one rule behind :func:`quantised_exponent` and
    :func:`quantise_step`."""
    # the tiny slack keeps exact powers of two (ratio = 2^m) from rounding up to m + 1
    m = np.ceil(np.log2(np.maximum(1.0, ratio)) - 1e-12).astype(np.int64)
    return np.clip(m, 0, int(math.floor(math.log2(k_base))))


def _grid_step(lo: Any, hi: Any, exponent: Any, k_base: int) -> np.ndarray:
    """The nested grid's step ``(hi - lo)/K_base · 2^m`` for exponents m (the one step-from-exponent formula)."""
    return (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / k_base * np.exp2(exponent)


def quantise_step(step: Any, lo: Any, hi: Any, k_base: int = 100) -> np.ndarray:
    """Round a step up to the nested grid ``(hi - lo)/K_base · 2^m`` (m ≥ 0 integer, ``2^m ≤ K_base`` so a step
    never exceeds hi - lo): the one nested-step rule (SPEC §2.2) of the device's epochs (:func:`quantised_step`)
    and of the coordinator's planned rounds (``coordinator.rounds.plan_rounding_steps``); devices follow only
    these steps of their own grid."""
    base = (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / k_base
    return _grid_step(lo, hi, _nested_exponent(np.asarray(step, dtype=float) / base, k_base), k_base)


def quantised_step(lo: Any, hi: Any, score: Any, k_base: int = 100, eta: float = 0.1) -> np.ndarray:
    """``(hi-lo)·max(1/K_base, score/η)`` rounded up to ``(hi-lo)/K_base·2^m`` (m ≥ 0, step ≤ hi - lo): the
    nested grid step of a volatility score (:func:`quantised_exponent`; the same grid as :func:`quantise_step`) —
    a device's epoch steps (:class:`EpochSteps`) and the coordinator's planned steps
    (``coordinator.rounds.plan_rounding_steps``)."""
    lo_arr, hi_arr = check_bounds(lo, hi)
    return _grid_step(lo_arr, hi_arr, quantised_exponent(score, k_base, eta), k_base)


class AlphaRounder:
    """α-point rounding with per-dimension offsets u_j ~ U[0,1) drawn once for life (see module docstring).

    Construct with :meth:`draw` on a device (from ``protocols.base.os_rng()``) and persist :meth:`to_state`.
    """

    def __init__(self, lo: Any, hi: Any, u: Any) -> None:
        lo_arr, hi_arr = check_bounds(lo, hi)
        u_arr = _finite(u, "u").reshape(-1)
        lo_arr, hi_arr, u_arr = np.broadcast_arrays(np.atleast_1d(lo_arr), np.atleast_1d(hi_arr), u_arr)
        if lo_arr.ndim != 1:
            raise ValueError("lo, hi and u must be 1-D (one entry per dimension)")
        if u_arr.size and (u_arr.min() < 0 or u_arr.max() >= 1):
            raise ValueError("offsets u must lie in [0, 1)")
        self.lo = lo_arr.astype(float).copy()
        self.hi = hi_arr.astype(float).copy()
        self.u = u_arr.astype(float).copy()
        self.d = self.u.size

    @classmethod
    def draw(cls, lo: Any, hi: Any, rng: np.random.Generator) -> AlphaRounder:
        """Draw fresh offsets u_j ~ U[0, 1), one per dimension."""
        lo_arr, hi_arr = np.broadcast_arrays(*check_bounds(lo, hi))
        return cls(lo_arr, hi_arr, rng.random(np.atleast_1d(lo_arr).size))

    def _steps(self, steps: Any) -> np.ndarray:
        """Checked steps, shape (d,): finite and > 0."""
        st = np.broadcast_to(_finite(steps, "steps"), (self.d,))
        if np.any(st <= 0):
            raise ValueError("steps must be > 0")
        return st

    def _index(self, x: Any, st: np.ndarray) -> np.ndarray:
        """:meth:`grid_index` with checked steps ``st``."""
        arr = _finite(x, "x")
        if arr.shape[-1:] != (self.d,):
            raise ValueError(f"x must have trailing dimension {self.d}, got shape {arr.shape}")
        t = (np.clip(arr, self.lo, self.hi) - self.lo) / st
        below = np.floor(t)
        # output R iff x + α ≥ R, i.e. (t - ⌊t⌋) + u ≥ 1
        return (below + ((t - below) + self.u >= 1.0)).astype(np.int64)

    def grid_index(self, x: Any, steps: Any) -> np.ndarray:
        """Integer index i of the rounded value lo + i·step: ``⌊(x - lo)/step + u⌋`` (x clipped to [lo, hi]).

        Identical to "L if x + α < R else R" with α = u·step. x has shape (..., d); steps shape (d,) or scalar.
        """
        return self._index(x, self._steps(steps))

    def round(self, x: Any, steps: Any) -> np.ndarray:
        """Rounded values lo + grid_index·step (unbiased over u; MSE (R - x)(x - L))."""
        st = self._steps(steps)
        return self.lo + self._index(x, st) * st

    def round_in_bounds(self, x: Any, steps: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(grid index i, min(lo + i·step, hi))``: what a device reports for a rounded dimension — the index for its
        memo key (:func:`protocols.memo_key.canonical_value`), the value clipped back to hi for normalisation (the
        top cell reaches past hi when step does not divide hi - lo). The one rounding step of the device
        (:mod:`edge_agent.rounding_state`) and of the fleet simulator (:mod:`simulations.fleet_pipeline`)."""
        st = self._steps(steps)
        index = self._index(x, st)
        return index, np.minimum(self.lo + index * st, self.hi)

    def to_state(self) -> dict[str, Any]:
        """Plain-data state (lists of floats) for the agent to persist."""
        return {"lo": self.lo.tolist(), "hi": self.hi.tolist(), "u": self.u.tolist()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> AlphaRounder:
        try:
            return cls(state["lo"], state["hi"], state["u"])
        except KeyError as exc:
            raise ValueError(f"AlphaRounder state is missing {exc}") from None


@dataclass(frozen=True)
class EpochPlan:
    """Rounding parameters frozen for one epoch: the grid steps and which dimensions are rounded."""

    epoch: int
    steps: np.ndarray
    exponents: np.ndarray
    volatile: np.ndarray


class EpochSteps:
    """Rounding steps (and the volatile mask) recomputed only at epoch boundaries (SPEC §2.2 correction).

    Epoch e covers rounds ``[e·epoch_length, (e+1)·epoch_length)``. :meth:`plan` returns the current epoch's
    :class:`EpochPlan`, recomputing it from the given scores when the round falls in a new epoch (also after a
    skipped epoch or a restart from persisted state). Within an epoch the steps and the mask stay fixed, so memo
    keys stay stable.
    """

    def __init__(
        self,
        lo: Any,
        hi: Any,
        epoch_length: int = 24,
        k_base: int = 100,
        eta: float = 0.1,
        tau: float = 0.01,
    ) -> None:
        lo_arr, hi_arr = check_bounds(lo, hi)
        lo_arr, hi_arr = np.broadcast_arrays(np.atleast_1d(lo_arr), np.atleast_1d(hi_arr))
        if isinstance(epoch_length, bool) or not isinstance(epoch_length, (int, np.integer)) or epoch_length < 1:
            raise ValueError(f"epoch_length must be an integer >= 1, got {epoch_length!r}")
        self.k_base, self.eta = _check_k_eta(k_base, eta)
        tau = float(tau)
        if not (math.isfinite(tau) and 0 <= tau < 1):
            raise ValueError(f"tau must lie in [0, 1), got {tau}")
        self.lo = lo_arr.astype(float).copy()
        self.hi = hi_arr.astype(float).copy()
        #: the base grid's step ``(hi - lo)/K_base`` (exponent 0)
        self.base_step = _grid_step(self.lo, self.hi, 0, self.k_base)
        self.epoch_length = int(epoch_length)
        self.tau = tau
        self._plan: EpochPlan | None = None

    def epoch_of(self, round_index: int) -> int:
        if isinstance(round_index, bool) or not isinstance(round_index, (int, np.integer)) or round_index < 0:
            raise ValueError(f"round_index must be an integer >= 0, got {round_index!r}")
        return int(round_index) // self.epoch_length

    def plan(self, round_index: int, scores: Any) -> EpochPlan:
        """The plan for ``round_index``; recomputed from ``scores`` (shape (d,)) only when a new epoch starts."""
        epoch = self.epoch_of(round_index)
        if self._plan is not None and epoch == self._plan.epoch:
            return self._plan
        if self._plan is not None and epoch < self._plan.epoch:
            raise ValueError(f"round {round_index} is in epoch {epoch}, before the current epoch {self._plan.epoch}")
        s = _finite(scores, "scores").reshape(-1)
        if s.size != self.lo.size:
            raise ValueError(f"expected {self.lo.size} scores, got {s.size}")
        exponents = quantised_exponent(s, self.k_base, self.eta)
        steps = _grid_step(self.lo, self.hi, exponents, self.k_base)
        self._plan = EpochPlan(epoch, steps, exponents, s > self.tau)
        return self._plan

    @property
    def current(self) -> EpochPlan | None:
        return self._plan

    def to_state(self) -> dict[str, Any]:
        plan = self._plan
        return {
            "lo": self.lo.tolist(),
            "hi": self.hi.tolist(),
            "epoch_length": self.epoch_length,
            "k_base": self.k_base,
            "eta": self.eta,
            "tau": self.tau,
            "plan": None
            if plan is None
            else {
                "epoch": plan.epoch,
                "exponents": plan.exponents.tolist(),
                "volatile": plan.volatile.tolist(),
            },
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> EpochSteps:
        try:
            obj = cls(
                state["lo"], state["hi"], int(state["epoch_length"]), int(state["k_base"]), state["eta"], state["tau"]
            )
            raw = state.get("plan")
            if raw is not None:
                exponents = np.asarray(raw["exponents"], dtype=np.int64)
                volatile = np.asarray(raw["volatile"], dtype=bool)
                if exponents.shape != obj.lo.shape or volatile.shape != obj.lo.shape:
                    raise ValueError("EpochSteps state: plan has the wrong number of dimensions")
                steps = _grid_step(obj.lo, obj.hi, exponents, obj.k_base)
                obj._plan = EpochPlan(int(raw["epoch"]), steps, exponents, volatile)
        except KeyError as exc:
            raise ValueError(f"EpochSteps state is missing {exc}") from None
        return obj


def epoch_plan(epochs: EpochSteps, detector: VolatilityDetector, index: int) -> EpochPlan | None:
    """The rounding plan for a device's reading number ``index`` (0-based, counted from its first reading), asked
    right after ``detector.push`` (or ``update``) with that reading: the one rule of the device
    (:mod:`edge_agent.rounding_state`) and of the fleet simulator (:mod:`simulations.fleet_pipeline`).

    * None while the first window fills (fewer than W + 1 values and no plan yet: scores of one or two values mean
      nothing) — the device reports exact values;
    * then :meth:`EpochSteps.plan` from the detector's scores: new steps and volatile mask only when ``index``
      starts a new epoch;
    * an ``index`` behind the current plan's epoch (a plan restored from persisted state after a clock change or a
      crash) keeps the current plan.
    """
    current = epochs.current
    if current is None and detector.count <= detector.window:
        return None
    try:
        if current is not None and epochs.epoch_of(index) == current.epoch:
            return current  # the epoch's plan: no scores needed (EpochSteps.plan would return it too)
        return epochs.plan(index, detector.scores)
    except ValueError:
        return epochs.current


@dataclass(frozen=True)
class RoundedReading:
    """What the device's rounding steps make of one reading (:func:`round_reading`; arrays over its dimensions).

    Attributes:
        plan: the epoch plan the reading was rounded with (None while the first window fills).
        values: the rounded value ``min(lo + i·step, hi)`` where ``rounded``, else the (clipped) reading.
        rounded: True where the dimension was α-rounded.
        exponents: the step exponent m of a rounded dimension (step ``(hi-lo)/K_base·2^m``), 0 elsewhere.
        grid_index: the grid index i of a rounded dimension, 0 elsewhere.
    """

    plan: EpochPlan | None
    values: np.ndarray
    rounded: np.ndarray
    exponents: np.ndarray
    grid_index: np.ndarray


def round_reading(detector: VolatilityDetector, epochs: EpochSteps, rounder: AlphaRounder, index: int, x: Any, *,
                  base_grid: bool = False) -> RoundedReading:
    """The device's rounding steps (SPEC §2.1–2.2) for reading number ``index`` with (clipped) values ``x``, one per
    dimension of the three objects: update the window, take the epoch plan (:func:`epoch_plan`; none until the first
    window is full), α-round the volatile dimensions with the plan's steps
    (:meth:`AlphaRounder.round_in_bounds`); the others keep their value. The one implementation of the edge agent
    (:class:`edge_agent.rounding_state.DimensionRounding`, one dimension) and of the fleet simulator
    (:mod:`simulations.fleet_pipeline`, a fleet's n·d dimensions at once).

    ``base_grid`` (an ablation of the fleet simulator, not in the SPEC): static dimensions — and every dimension
    before the first plan — are α-rounded on the base grid ``(hi - lo)/K_base`` too.
    """
    x = np.asarray(x, dtype=float).reshape(-1)
    detector.push(x)
    plan = epoch_plan(epochs, detector, index)
    zeros = np.zeros(x.size, dtype=np.int64)
    if plan is None and not base_grid:
        return RoundedReading(None, x, np.zeros(x.size, dtype=bool), zeros, zeros)
    base_step = epochs.base_step
    if plan is None:  # base_grid during warm-up: every dimension on the base grid
        volatile, steps, exponents = np.zeros(x.size, dtype=bool), base_step, zeros
    else:
        volatile = plan.volatile
        steps = np.where(volatile, plan.steps, base_step)
        exponents = np.where(volatile, plan.exponents, 0)
    rounded = volatile | base_grid
    grid_index, value = rounder.round_in_bounds(x, steps)
    return RoundedReading(plan, np.where(rounded, value, x), rounded, np.where(rounded, exponents, 0),
                          np.where(rounded, grid_index, 0))
