"""The fleet simulator: a vectorised *driver* of the device pipeline (SPEC §2) for n devices over τ rounds.

It is not a second pipeline. The steps that decide what a device reports and what it is charged are defined once,
in the mechanism library, and the edge agent — ``edge_agent/pipeline.py`` (clip, normalise, memo key, privatize)
and ``edge_agent/rounding_state.py`` (one dimension's window, epoch plans and life-long offset) — calls the same
ones — steps 2–4 are :func:`protocols.rounding.round_reading`, which a device calls per dimension and this module
calls for the whole fleet (the equivalence test below checks that they agree bit for bit):

1. clip x to [lo, hi] (:func:`protocols.contract.clip`; a documented bias, never an error);
2. volatility window of the last W + 1 values per dimension (:class:`protocols.rounding.VolatilityDetector`);
3. epoch plan (:func:`protocols.rounding.epoch_plan` over :class:`protocols.rounding.EpochSteps`): quantised steps
   ``(hi-lo)/K_base·2^m`` and the volatile mask, recomputed only at epoch boundaries; no plan until the first
   window is full (until then the device reports exact values — pass ``history`` to let devices fill their
   windows before round 0, as a device that samples readings without reporting them);
4. α-point rounding of volatile dimensions with life-long offsets u
   (:meth:`protocols.rounding.AlphaRounder.round_in_bounds`): grid index ``⌊(x-lo)/step + u⌋``, value
   ``min(lo + index·step, hi)``;
5. normalise (:func:`protocols.contract.normalise`);
6. memoized report: the memo key is built from the canonical values of :func:`protocols.memo_key.canonical_value`
   — ``["g", m, grid index]`` for a rounded dimension, ``["x", clipped value]`` otherwise — which a device HMACs
   (:func:`protocols.memo_key.record_key`) and the simulator compares as integer rows
   (:func:`protocols.memo_key.canonical_codes`). A key the device has seen before returns its stored report and
   costs 0; a new key costs ε (the mechanism's ε) — the ledger of the ``value`` privacy unit; ``memoize=False`` is
   the ``device`` unit (every report charged).

What this module adds is only the driving: every device at once, and the fleet's estimates. The equivalence test,
tests/simulations/test_fleet_pipeline_equivalence.py, drives real agents (:class:`edge_agent.Agent`) and this simulator on
the same readings and offsets and pins them together: per device and round the same rounded and normalised values,
canonical values (and memo keys), memo hits and charges — a reading of -0.0 included: it is one value with 0.0
(:func:`protocols.memo_key.canonical_value`), on the device as here.

**Vectorisation.** The rounding objects are used as-is on the fleet flattened to n·d "dimensions" (devices are
synchronised on rounds, so one object holds every device's windows, plans and offsets; a dimension's volatility
score is the same number as on a device holding it alone). Keys depend only on the data and u, never on the noise,
so memo hits are found for all rounds at once: each device's key row is hashed twice (two independent 64-bit
hashes), rows are stably sorted by (device, first hash) (ties keep round order), and the first row of each group
is the device's first use of that key; every row of a group must match the group's first row on the second hash,
so a collision (probability ~ 2^-128 per pair) raises instead of silently merging keys. New reports are privatized
round by round, vectorised over the devices with a new key.

**Accounting.** ``charged[i, r]`` is the ε device i spends in round r (ε for a new key, else 0), ``cumulative``
its running total — SPEC §4's memoization bound: total ≤ (#distinct keys)·ε.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.accounting import memo_charge, report_charge
from protocols.base import check_bounds
from protocols import catalogue
from protocols.contract import AUTO, clip, denormalise, normalise
from protocols.memo_key import canonical_codes, canonical_value
from protocols.pipeline import choose_mechanism
from protocols.rounding import AlphaRounder, EpochSteps, VolatilityDetector, round_reading

__all__ = ["MemoizedPipeline", "FleetRun", "FleetTrace"]


def _bounds(lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
    """One entry per dimension (scalars broadcast), checked by :func:`protocols.base.check_bounds`."""
    lo_arr = np.atleast_1d(np.asarray(lo, dtype=float))
    hi_arr = np.atleast_1d(np.asarray(hi, dtype=float))
    lo_arr, hi_arr = np.broadcast_arrays(lo_arr, hi_arr)
    if lo_arr.ndim != 1:
        raise ValueError("lo and hi must be scalars or 1-D arrays (one entry per dimension)")
    lo_arr, hi_arr = check_bounds(lo_arr, hi_arr)
    return lo_arr.astype(float), hi_arr.astype(float)


# ---------------------------------------------------------------------------------------------------- hashing


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (a bijection of uint64), vectorised."""
    z = z.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _row_hash(cols: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit hash of each row of a uint64 matrix (N, K)."""
    h = np.full(cols.shape[0], np.uint64(seed))
    for j in range(cols.shape[1]):
        h = _mix64(h ^ _mix64(cols[:, j] + np.uint64((j + 1) * 0x9E3779B97F4A7C15 % 2**64)))
    return h


_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344)


def _key_hashes(kind: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each device's key row (kind, val of shape (n, d))."""
    cols = np.concatenate([kind, val], axis=1).view(np.uint64)
    return _row_hash(cols, _SEEDS[0]), _row_hash(cols, _SEEDS[1])


def _first_uses(h1: np.ndarray, h2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group ids (n, τ) of identical (device, key) rows and the mask of each group's first round.

    Rows are grouped by a hash of (device, h1) with a stable sort (ties keep round order, so a group's first row
    is the device's first use of the key); every row of a group must agree with the group's first row on the
    device and on the independent hash h2, else a collision is reported instead of merging different keys.
    """
    n, tau = h1.shape
    device = np.repeat(np.arange(n, dtype=np.uint64), tau)
    g = _mix64(h1.reshape(-1) ^ _mix64(device + np.uint64(0x452821E638D01377)))
    order = np.argsort(g, kind="stable")
    g_s = g[order]
    start = np.ones(order.size, dtype=bool)
    start[1:] = g_s[1:] != g_s[:-1]
    gid_sorted = np.cumsum(start) - 1
    first_row = order[start][gid_sorted]
    h2f = h2.reshape(-1)
    if not (np.array_equal(device[order], device[first_row]) and np.array_equal(h2f[order], h2f[first_row])):
        raise RuntimeError("memo-key hash collision (probability ~ (nτ)²/2^65): keys would be merged")
    gid = np.empty(order.size, dtype=np.int64)
    gid[order] = gid_sorted
    first = np.zeros(order.size, dtype=bool)
    first[order[start]] = True
    return gid.reshape(n, tau), first.reshape(n, tau)


# ---------------------------------------------------------------------------------------------------- simulator


@dataclass
class FleetRun:
    """Result of :meth:`MemoizedPipeline.run` (original units unless stated; r = round, i = device).

    Attributes:
        estimates: (τ, d) per-round unbiased estimates of the mean of the rounded records, de-normalised.
        estimates_normalised: (τ, d) the same in [-1, 1] units.
        stderr: (τ, d) analytic standard errors (from the mechanism's exact variance at the rounded records).
        truth: (τ, d) per-round means of the clipped raw values.
        target: (τ, d) per-round means of the rounded values (what ``estimates`` is unbiased for given u;
            E over u of ``target`` is ``truth`` except for cells clipped at hi).
        charged: (n, τ) ε charged to device i in round r.
        cumulative: (n, τ) running totals of ``charged``.
        new_key: (n, τ) True where the device's memo key was new (a fresh report left the device).
        rounded_fraction: (τ, d) fraction of devices whose dimension was α-rounded.
        clipped: number of raw values clipped to the bounds.
        u: (n, d) the α offsets used.
        epsilon: ε of one report.
        mechanism: the record mechanism.
        report_table / report_index: when kept, the reports of round r are ``report_table[report_index[:, r]]``.
    """

    estimates: np.ndarray
    estimates_normalised: np.ndarray
    stderr: np.ndarray
    truth: np.ndarray
    target: np.ndarray
    charged: np.ndarray
    cumulative: np.ndarray
    new_key: np.ndarray
    rounded_fraction: np.ndarray
    clipped: int
    u: np.ndarray
    epsilon: float
    mechanism: Any = field(repr=False)
    report_table: np.ndarray | None = field(default=None, repr=False)
    report_index: np.ndarray | None = field(default=None, repr=False)

    @property
    def total_spend(self) -> np.ndarray:
        """(n,) total ε spent by each device."""
        return self.cumulative[:, -1].copy()

    def reports(self, round_index: int) -> np.ndarray:
        """The reports the coordinator receives in round ``round_index`` (needs ``keep_reports``)."""
        if self.report_table is None or self.report_index is None:
            raise ValueError("reports were not kept: run(..., keep_reports=True)")
        return self.report_table[self.report_index[:, round_index]]


@dataclass
class FleetTrace:
    """What each device's pipeline made of each reading (:meth:`MemoizedPipeline.trace`); arrays (n, τ, d).

    Attributes:
        values: the values reported, in original units: rounded ``min(lo + index·step, hi)`` where ``rounded``,
            else the clipped reading.
        rounded: True where the dimension was α-rounded.
        exponents: the step exponent m of a rounded cell (step ``(hi-lo)/K_base·2^m``), 0 elsewhere.
        grid_index: the grid index of a rounded cell, 0 elsewhere.
        lo, hi: the bounds (d,).
    """

    values: np.ndarray
    rounded: np.ndarray
    exponents: np.ndarray
    grid_index: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def normalised(self) -> np.ndarray:
        """The values in [-1, 1] (:func:`protocols.contract.normalise`): what the mechanism privatizes."""
        return normalise(self.values, self.lo, self.hi)

    def canonical(self, device: int, round_index: int) -> list[list[Any]]:
        """Device ``device``'s canonical memo-key values in round ``round_index``
        (:func:`protocols.memo_key.canonical_value`, one per dimension): a device's memo key is
        ``record_key(secret, stream, spec, canonical(...))``."""
        at = (device, round_index)
        return [canonical_value(exponent=int(m), grid_index=int(i)) if r else canonical_value(float(v))
                for v, r, m, i in zip(self.values[at], self.rounded[at], self.exponents[at], self.grid_index[at])]


class _FleetSteps:
    """The device's per-reading steps (module docstring, 2–4) for a whole fleet at once: the device's own
    :func:`protocols.rounding.round_reading` on the fleet flattened to n·d dimensions, one reading per device and
    call."""

    def __init__(self, pipe: MemoizedPipeline, n: int, u: np.ndarray) -> None:
        self.lo, self.hi = np.tile(pipe.lo, n), np.tile(pipe.hi, n)
        self.detector = VolatilityDetector(self.lo, self.hi, window=pipe.window, tau=pipe.tau)
        self.epochs = EpochSteps(self.lo, self.hi, epoch_length=pipe.epoch_length, k_base=pipe.k_base,
                                 eta=pipe.eta, tau=pipe.tau)
        self.rounder = AlphaRounder(self.lo, self.hi, u.reshape(-1))  # validates u ∈ [0, 1)
        self.rounding, self.base_grid = pipe.rounding, pipe.static == "base_grid"
        self.index = 0  # the reading's number: devices are synchronised on readings

    def observe(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One clipped reading per device (n·d,) → (value, rounded?, step exponent, grid index), each (n·d,)."""
        out = round_reading(self.detector, self.epochs, self.rounder, self.index, row, base_grid=self.base_grid)
        self.index += 1
        if not self.rounding:  # the no-rounding ablation: every dimension keeps its value
            zeros = np.zeros(row.size, dtype=np.int64)
            return row, np.zeros(row.size, dtype=bool), zeros, zeros
        return out.values, out.rounded, out.exponents, out.grid_index


class MemoizedPipeline:
    """The device pipeline (module docstring) driven for a fleet of n devices over τ rounds.

    Args:
        lo, hi: declared bounds per dimension (d,).
        epsilon: ε of one (new) report.
        mechanism: ``"auto"`` (:func:`choose_mechanism` for ``query``, as a device's ``auto`` stream), a catalogue
            name of a record mechanism (``"haar"`` — :class:`protocols.pipeline.HaarRecord` —, ``"ksampling"``, ``"duchi_md"``), or a
            mechanism object with ``privatize``/``estimate``/``variance`` and attribute ``d``.
        mechanism_params: extra constructor parameters for a named mechanism (e.g. ``{"split": 0.3}``).
        window, tau, epoch_length, k_base, eta: the rounding parameters (SPEC §2.1–2.2 defaults).
        memoize: serve repeated keys from the memo table (False: every round is a new report).
        rounding: α-round volatile dimensions (False: every dimension keeps its raw value).
        static: ``"raw"`` (SPEC §2.2: static dimensions skip rounding, so any change of a static value is a new
            memo key) or ``"base_grid"`` (an ablation, not in the SPEC: static dimensions — and every dimension
            before the first plan — are α-rounded on the base grid (hi-lo)/K_base, so sub-threshold drift
            stops costing ε every round; still unbiased over u).
    """

    def __init__(
        self,
        lo: Any,
        hi: Any,
        epsilon: float,
        mechanism: Any = "haar",
        *,
        mechanism_params: dict[str, Any] | None = None,
        query: str = "mean",
        window: int = 16,
        tau: float = 0.01,
        epoch_length: int = 24,
        k_base: int = 100,
        eta: float = 0.1,
        memoize: bool = True,
        rounding: bool = True,
        static: str = "raw",
    ) -> None:
        self.lo, self.hi = _bounds(lo, hi)
        self.d = self.lo.size
        params = dict(mechanism_params or {})
        name: str | None = None
        if isinstance(mechanism, str):
            if mechanism == AUTO:  # the device's ``auto`` (edge_agent.plans): the same chooser, the same winner
                if params:
                    raise ValueError("mechanism 'auto' takes no mechanism_params")
                name, _, self.mechanism = choose_mechanism(epsilon, self.d, query).deployed()
            else:
                name = mechanism
                self.mechanism = catalogue.build(mechanism, epsilon=epsilon, d=self.d, **params)
            # a scalar mechanism (auto's winner for d = 1) takes records of one value
            width = 1 if catalogue.entry(name).family is catalogue.Family.NUMERIC else self.mechanism.d
        else:
            self.mechanism = mechanism
            width = getattr(self.mechanism, "d", None)
        if width != self.d:
            raise ValueError(f"the mechanism must take records of {self.d} dimensions")
        self.epsilon = float(self.mechanism.epsilon)
        # validated by the rounding objects on first use; checked here for early errors
        VolatilityDetector(self.lo, self.hi, window=window, tau=tau)
        EpochSteps(self.lo, self.hi, epoch_length=epoch_length, k_base=k_base, eta=eta, tau=tau)
        self.window, self.tau, self.epoch_length, self.k_base, self.eta = window, tau, epoch_length, k_base, eta
        if static not in ("raw", "base_grid"):
            raise ValueError(f"static must be 'raw' or 'base_grid', got {static!r}")
        self.memoize = bool(memoize)
        # the ledger's charge of one report (accounting.report_charge: value unit with the memo, device unit
        # without); a mechanism object passed in (no catalogue name) is charged its ε
        unit = "value" if self.memoize else "device"
        self.report_epsilon = self.epsilon if name is None else report_charge(name, self.mechanism, self.epsilon, unit)
        self.rounding = bool(rounding)
        self.static = static

    def _check_records(self, records: Any, name: str) -> np.ndarray:
        x = np.asarray(records, dtype=float)
        if x.ndim != 3 or x.shape[2] != self.d:
            raise ValueError(f"{name} must have shape (n devices, rounds, {self.d}), got {x.shape}")
        if x.size and not np.all(np.isfinite(x)):
            raise ValueError(f"{name} must be finite; got NaN or infinity")
        return x

    def _inputs(
        self, records: Any, history: Any, u: Any, rng: np.random.Generator | None
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Checked (records, history, u); u drawn from ``rng`` (once per device and dimension) when None."""
        x = self._check_records(records, "records")
        n, tau, d = x.shape
        if n == 0 or tau == 0:
            raise ValueError("records need at least one device and one round")
        hist = None if history is None else self._check_records(history, "history")
        if hist is not None and hist.shape[0] != n:
            raise ValueError(f"history must have {n} devices, got {hist.shape[0]}")
        if u is None:
            if rng is None:
                raise ValueError("give the α offsets u (n devices, d)")
            u = rng.random((n, d))
        u_arr = np.asarray(u, dtype=float)
        if u_arr.shape != (n, d):
            raise ValueError(f"u must have shape ({n}, {d}), got {u_arr.shape}")
        return x, hist, u_arr

    def _steps(self, n: int, u: np.ndarray, hist: np.ndarray | None) -> _FleetSteps:
        steps = _FleetSteps(self, n, u)
        if hist is not None:
            for h in range(hist.shape[1]):
                steps.observe(clip(hist[:, h, :], self.lo, self.hi).reshape(-1))
        return steps

    def trace(self, records: Any, u: Any, *, history: Any = None) -> FleetTrace:
        """What each device's pipeline makes of each reading of ``records`` (n, τ, d) with offsets ``u`` (n, d):
        the rounded values, which cells were rounded, and the canonical memo-key values (see :class:`FleetTrace`);
        the same steps as :meth:`run`, without privatizing."""
        x, hist, u_arr = self._inputs(records, history, u, None)
        n, tau, d = x.shape
        steps = self._steps(n, u_arr, hist)
        xc = clip(x, self.lo, self.hi)
        out = [np.empty((n, tau, d)), np.empty((n, tau, d), dtype=bool), np.empty((n, tau, d), dtype=np.int64),
               np.empty((n, tau, d), dtype=np.int64)]
        for r in range(tau):
            for arr, got in zip(out, steps.observe(xc[:, r, :].reshape(-1))):
                arr[:, r, :] = got.reshape(n, d)
        return FleetTrace(*out, lo=self.lo, hi=self.hi)

    def run(
        self,
        records: Any,
        rng: np.random.Generator,
        *,
        history: Any = None,
        u: Any = None,
        keep_reports: bool = False,
        stderr: bool = True,
    ) -> FleetRun:
        """Simulate every device over the rounds of ``records`` (n, τ, d); see :class:`FleetRun`.

        ``history`` (n, h, d): earlier readings that only fill the volatility windows (no reports, no charge).
        ``u`` (n, d): α offsets in [0, 1) (default: drawn from ``rng``, once per device and dimension).
        ``stderr=False`` skips the analytic standard errors (NaN) for speed.
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError("rng must be a numpy.random.Generator")
        x, hist, u_arr = self._inputs(records, history, u, rng)
        n, tau, d = x.shape
        steps = self._steps(n, u_arr, hist)
        xc = clip(x, self.lo, self.hi)
        clipped = int(np.count_nonzero(xc != x))
        t = np.empty_like(x)
        h1 = np.empty((n, tau), dtype=np.uint64)
        h2 = np.empty((n, tau), dtype=np.uint64)
        rounded_fraction = np.empty((tau, d))
        target = np.empty((tau, d))
        for r in range(tau):
            y, rounded, exponents, grid_index = steps.observe(xc[:, r, :].reshape(-1))
            kind, code = canonical_codes(y, rounded, exponents, grid_index)
            y = y.reshape(n, d)
            t[:, r, :] = normalise(y, self.lo, self.hi)
            h1[:, r], h2[:, r] = _key_hashes(kind.reshape(n, d), code.reshape(n, d))
            rounded_fraction[r] = rounded.reshape(n, d).mean(axis=0)
            target[r] = y.mean(axis=0)

        if self.memoize:
            gid, new_key = _first_uses(h1, h2)
            table: np.ndarray | None = None
        else:
            gid, new_key = None, np.ones((n, tau), dtype=bool)
            table = None
        kept: list[np.ndarray] = []
        est = np.empty((tau, d))
        var = np.empty((tau, d))
        for r in range(tau):
            fresh = np.flatnonzero(new_key[:, r])
            reports_new = self.mechanism.privatize(t[fresh, r, :], rng) if fresh.size else None
            if gid is not None:
                if table is None:
                    width = reports_new.shape[1]  # type: ignore[union-attr]
                    table = np.empty((int(gid.max()) + 1, width), dtype=reports_new.dtype)  # type: ignore[union-attr]
                if fresh.size:
                    table[gid[fresh, r]] = reports_new
                reports = table[gid[:, r]]
            else:
                reports = reports_new  # every device reports afresh
                if keep_reports:
                    kept.append(reports)  # type: ignore[arg-type]
            est[r] = self.mechanism.estimate(reports)
            if stderr:
                var[r] = np.asarray(self.mechanism.variance(t[:, r, :]), dtype=float).reshape(n, d).mean(axis=0)
            else:
                var[r] = np.nan

        scale = (self.hi - self.lo) / 2.0
        charged = np.where(new_key, memo_charge(self.report_epsilon, memo_hit=False),
                           memo_charge(self.report_epsilon, memo_hit=True))
        if gid is not None:
            report_table, report_index = (table, gid) if keep_reports else (None, None)
        elif keep_reports:
            report_table = np.concatenate(kept, axis=0)
            report_index = (np.arange(tau)[None, :] * n + np.arange(n)[:, None]).astype(np.int64)
        else:
            report_table = report_index = None
        return FleetRun(
            estimates=denormalise(est, self.lo, self.hi),
            estimates_normalised=est,
            stderr=scale * np.sqrt(var / n),
            truth=xc.mean(axis=0),
            target=target,
            charged=charged,
            cumulative=np.cumsum(charged, axis=1),
            new_key=new_key,
            rounded_fraction=rounded_fraction,
            clipped=clipped,
            u=u_arr,
            epsilon=self.epsilon,
            mechanism=self.mechanism,
            report_table=report_table,
            report_index=report_index,
        )
