"""The released representation of the numeric mechanisms: an index on a public grid (SPEC §3.0).

Every numeric mechanism releases an integer ``j ∈ [0, grid)`` (:func:`protocols.exact` explains why never a double),
and ``debias(j)`` maps it to an unbiased estimate of the input. :class:`GridMechanism` holds what they share: the
index check of the decoder (``off grid`` for anything else), the exact channel ``P[j | i]`` over the input grid
(:meth:`GridMechanism.channel`, which tests enumerate), and the privacy loss computed on it
(:func:`channel_epsilon`). :class:`WindowMechanism` is the two-level window channel of PM and PDP.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from protocols.base import NumericMechanism, check_int, check_unit_interval, check_unit_value
from protocols.exact import MAX_GRID, WindowChannel, randomized_round, randomized_round_one

from ._common import as_result, check_indices, check_rng

__all__ = ["DEFAULT_GRID", "check_grid", "check_indices", "GridMechanism", "WindowMechanism", "channel_epsilon"]

#: Released values of a numeric mechanism by default (2^15: a k-sampling row adds one "not sampled" value and stays
#: within :data:`protocols.exact.MAX_GRID`). At this grid the discrete law's variance is within 0.05 % of the
#: continuous mechanism's at ε ∈ [0.1, 4] (tests/protocols/numeric/test_grid.py asserts it); a finer grid buys nothing.
DEFAULT_GRID = 1 << 15


def check_grid(grid: Any, minimum: int = 2) -> int:
    return check_int(grid, "grid", minimum, MAX_GRID)


def channel_epsilon(rows: list[list[Any]]) -> Fraction | Decimal:
    """``max_j max_i P[j|i] / min_i P[j|i]`` over an exact channel (rows: inputs; entries Fractions or Decimals):
    the exact privacy loss e^ε of the released set, by enumeration (columns no input reaches are skipped)."""
    worst: Any = 1
    for col in zip(*rows):
        lo, hi = min(col), max(col)
        if hi == 0:  # an output no input produces
            continue
        if lo <= 0:
            raise ValueError("an output impossible under some input and possible under another: unbounded loss")
        worst = max(worst, hi / lo)
    return worst


class GridMechanism(NumericMechanism):
    """A numeric mechanism releasing grid indices (see the module docstring). Subclasses set :attr:`grid` (released
    values), :attr:`inputs` (points of the input grid ``x_i = −1 + 2i/(inputs − 1)``) and implement
    ``_release(positions, rng)`` / ``_release_one``, ``_estimates`` (the debiased value of every index) and
    ``channel_row(i)`` (exact ``P[j | x_i]`` for every j)."""

    grid: int
    inputs: int

    @functools.cached_property
    def _table(self) -> np.ndarray:
        """The debiased value of every index, built on first use: a device, which only privatizes, never holds it
        (up to 2^16 floats per mechanism)."""
        return self._estimates()

    def _estimates(self) -> np.ndarray:
        raise NotImplementedError

    @property
    def input_grid(self) -> np.ndarray:
        return np.linspace(-1.0, 1.0, self.inputs)

    def _positions(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return randomized_round((t + 1.0) * ((self.inputs - 1) / 2.0), rng)

    def _position_one(self, t: float, rng: np.random.Generator) -> int:
        return randomized_round_one((t + 1.0) * ((self.inputs - 1) / 2.0), rng)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        rng = check_rng(rng)
        flat = t.reshape(-1)
        return self._release(self._positions(flat, rng), rng).reshape(t.shape)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> int:
        t = check_unit_value(value)
        return self._release_one(self._position_one(t, check_rng(rng)), rng)

    def _release(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _release_one(self, position: int, rng: np.random.Generator) -> int:
        return int(self._release(np.array([position]), rng)[0])

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return self._table[check_indices(reports, self.grid)]

    @property
    def bound(self) -> float:
        """The largest |debiased value|."""
        return float(np.max(np.abs(self._table)))

    def channel_row(self, i: int) -> list[Any]:
        """Exact ``P[j | x_i]`` for j in [0, grid): Fractions (Decimals for the Laplace and Gaussian laws)."""
        raise NotImplementedError

    def channel(self) -> list[list[Any]]:
        """Every row of the exact channel (small grids: tests enumerate it)."""
        return [self.channel_row(i) for i in range(self.inputs)]

    def row_moments(self, i: Any) -> tuple[np.ndarray, np.ndarray]:
        """``E[debias(J) | x_i]`` and ``Var(debias(J) | x_i)`` at input grid indices i (floats)."""
        raise NotImplementedError

    def variance(self, t: Any = 0.0) -> Any:
        """Exact per-user variance at t: ``E_i[Var(· | x_i)] + Var_i(x_i)`` over the randomized rounding of t to
        its two neighbouring grid inputs (the second term is ``f(1−f)Δ²`` with Δ the input step; 0 on the grid)."""
        tt = check_unit_interval(t, "t")
        x = (tt + 1.0) * ((self.inputs - 1) / 2.0)
        lo = np.minimum(np.floor(x), self.inputs - 2).astype(np.int64)
        f = x - lo
        _, v_lo = self.row_moments(lo)
        _, v_hi = self.row_moments(lo + 1)
        step = 2.0 / (self.inputs - 1)
        return as_result((1 - f) * v_lo + f * v_hi + f * (1 - f) * step * step, t)

    def worst_case_variance(self) -> float:
        """``max_i Var(· | x_i) + Δ²/4``: between two grid inputs the variance is their interpolation plus the
        rounding's ``f(1−f)Δ² ≤ Δ²/4`` (Δ the input step), so this bounds every t and is within Δ²/4 of the max."""
        step = 2.0 / (self.inputs - 1)
        return float(np.max(self.row_moments(np.arange(self.inputs))[1])) + step * step / 4

    def _params(self) -> dict[str, Any]:
        out = super()._params()
        if self.grid != self._default_grid():
            out["grid"] = self.grid
        return out

    def _default_grid(self) -> int:
        return DEFAULT_GRID


class WindowMechanism(GridMechanism):
    """A sliding-window mechanism on a grid (PM, PDP): ``grid`` cells, a window of ``K ≈ fraction·grid`` cells
    (``grid − K`` a multiple of 8, so 0, ±1/4, ±1/2, ±1 are input grid points), input grid ``x_s = −1 + 2s/(grid−K)``
    and the exact :class:`~protocols.exact.WindowChannel`. ``E[j | s] = A + B·s``, so
    ``debias(j) = 2(j − A)/(B(grid − K)) − 1`` is exactly unbiased; ε = ln(H/L) ≤ the ε asked for."""

    def _setup_window(self, epsilon: float, grid: int, fraction: float) -> None:
        window = grid - 8 * round(grid * (1.0 - fraction) / 8)
        if window < 1:
            window = grid - 8 * ((grid - 1) // 8)
        if window < 1 or window >= grid:
            raise ValueError(f"grid {grid} is too small for this mechanism at epsilon {epsilon}")
        self.grid = grid
        self.window_channel = WindowChannel(grid, window, epsilon)
        self.inputs = self.window_channel.positions
        ch = self.window_channel
        self._scale = 2.0 / (float(ch.slope) * (self.inputs - 1))

    def _estimates(self) -> np.ndarray:
        return self._scale * (np.arange(self.grid, dtype=float) - float(self.window_channel.intercept)) - 1.0

    def _release(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.window_channel.sample(positions, rng)

    def _release_one(self, position: int, rng: np.random.Generator) -> int:
        return self.window_channel.sample_one(position, rng)

    def channel_row(self, i: int) -> list[Any]:
        ch = self.window_channel
        return [Fraction(int(w), ch.total) for w in ch.weights(i)]

    def row_moments(self, i: Any) -> tuple[np.ndarray, np.ndarray]:
        ch = self.window_channel
        s = np.asarray(i, dtype=float)
        mean = ch.mean(s)
        var_j = ch.second_moment(s) - mean**2
        return self._scale * (mean - float(ch.intercept)) - 1.0, self._scale**2 * var_j

