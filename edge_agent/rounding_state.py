"""Per-dimension rounding state (SPEC §2.1–2.2): the volatility window, the epoch steps and the life-long α offset.

3. **Volatility** (SPEC §2.1): a sliding window of the last W values per dimension, in RAM only (never persisted),
   ``score = Σ|v_t − v_{t−1}| / (W·(hi − lo))``; volatile iff ``score > τ``.
4. **Adaptive α-point rounding** (SPEC §2.2; :mod:`protocols.rounding`): for volatile dimensions the grid step
   ``(hi−lo)/K_base·2^m`` is recomputed only at epoch boundaries (every ``epoch_readings`` readings), the offset
   ``u ~ U[0,1)`` is drawn once for life and persisted; output ``lo + ⌊(x−lo)/step + u⌋·step`` (clipped to hi).
   A round's public step (:mod:`edge_agent.round_contract`) is applied with the same offset
   (:meth:`DimensionRounding.round_with`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from protocols.base import os_rng
from protocols.memo_key import canonical_value
from protocols.rounding import AlphaRounder, EpochSteps, VolatilityDetector, round_reading

from .config import DimensionConfig

__all__ = ["DimensionRounding"]


class DimensionRounding:
    """Volatility window (RAM) + epoch steps + life-long α offset for one numeric dimension."""

    def __init__(self, dim: DimensionConfig, state: Mapping[str, Any] | None,
                 rng: np.random.Generator | None = None) -> None:
        r = dim.rounding
        lo, hi = float(dim.lo), float(dim.hi)  # type: ignore[arg-type]
        self.detector = VolatilityDetector(lo, hi, window=r.window, tau=r.tau)
        fresh = EpochSteps(lo, hi, epoch_length=r.epoch_readings, k_base=r.k_base, eta=r.eta, tau=r.tau)
        self.epochs = fresh
        self.rounder: AlphaRounder | None = None
        self.index = 0
        if state:
            try:
                rounder = AlphaRounder.from_state(state["rounder"])
                if rounder.lo.tolist() == [lo] and rounder.hi.tolist() == [hi]:
                    self.rounder = rounder
                epochs = EpochSteps.from_state(state["epochs"])
                if epochs.to_state() | {"plan": None} == fresh.to_state() | {"plan": None}:
                    self.epochs = epochs
                    self.index = int(state.get("index", 0))
            except (KeyError, ValueError, TypeError):
                pass  # a changed or damaged rounding config starts afresh (u redrawn only if bounds changed)
        if self.rounder is None:
            self.rounder = AlphaRounder.draw(lo, hi, rng if rng is not None else os_rng())
        self.dirty = True

    def observe(self, x: float) -> tuple[float, list[Any], bool]:
        """Update the window with x (already clipped); return (value, canonical form, rounded?) —
        :func:`protocols.rounding.round_reading` of this one dimension."""
        before = self.epochs.current.epoch if self.epochs.current is not None else None
        # no plan while the first window fills; an index behind a restored plan (clock/crash) keeps the plan
        out = round_reading(self.detector, self.epochs, self.rounder, self.index, [x])  # type: ignore[arg-type]
        self.index += 1
        if out.plan is not None and before != out.plan.epoch:  # a new epoch plan: persist it (with the reading index)
            self.dirty = True
        # (while the first window fills there is no plan to keep: the reading index alone is not written each
        # reading — after a restart the window refills anyway, and epochs count from the last index written)
        if bool(out.rounded[0]):
            return (float(out.values[0]), canonical_value(exponent=int(out.exponents[0]),
                                                          grid_index=int(out.grid_index[0])), True)
        return x, canonical_value(x), False

    def round_with(self, x: float, step: float) -> tuple[float, list[Any]]:
        """α-round x (clipped) with a step a round asks for, using the life-long offset u.

        Canonical form ``["g", m, i]`` when the step is the device's nested grid step ``(hi−lo)/K_base·2^m`` (so it
        shares memo entries with the device's own plans), else ``["s", step, i]``.
        """
        rounder = self.rounder
        assert rounder is not None
        index, value = rounder.round_in_bounds([x], [step])
        gi, y = int(index[0]), float(value[0])
        base = (float(rounder.hi[0]) - float(rounder.lo[0])) / self.epochs.k_base
        m = round(math.log2(step / base)) if step >= base * (1 - 1e-9) else -1
        if m >= 0 and math.isclose(base * 2.0**m, step, rel_tol=1e-9):
            return y, ["g", int(m), gi]
        return y, ["s", float(step), gi]

    def to_state(self) -> dict[str, Any]:
        return {"rounder": self.rounder.to_state(), "epochs": self.epochs.to_state(), "index": self.index}  # type: ignore[union-attr]
