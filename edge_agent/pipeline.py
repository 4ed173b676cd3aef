"""The edge pipeline (SPEC §2): validate → clip → volatility → α-rounding → normalise → memo key → privatize.

For one reading (a mapping field → value) :meth:`Pipeline.observe` returns a :class:`Record`:

1. **Validate.** Every configured dimension must be present; numeric values must be real numbers (not bool, not
   text) and finite; categorical values integers in [0, k) or one of the configured labels. Anything else raises
   :class:`InvalidRecord` and the whole record is dropped: nothing is sent, nothing is charged.
2. **Clip** numeric values to [lo, hi]. Clipping is a documented bias, not an error; it is counted per dimension.
3. **Volatility** (SPEC §2.1): a sliding window of the last W values per dimension, in RAM only (never persisted),
   ``score = Σ|v_t − v_{t−1}| / (W·(hi − lo))``; volatile iff ``score > τ``.
4. **Adaptive α-point rounding** (SPEC §2.2; :mod:`protocols.rounding`): for volatile dimensions the grid step
   ``(hi−lo)/K_base·2^m`` is recomputed only at epoch boundaries (every ``epoch_readings`` readings), the offset
   ``u ~ U[0,1)`` is drawn once for life and persisted; output ``lo + ⌊(x−lo)/step + u⌋·step`` (clipped to hi).
5. **Normalise** to ``t = 2(x − lo)/(hi − lo) − 1 ∈ [−1, 1]``.

:meth:`Pipeline.prepare` then turns a record into one :class:`PreparedReport` per stream. A stream is one dimension
or a *group* of numeric dimensions privatized together by one vector mechanism (``ksampling``, ``duchi_md``, later
``haar``). The memo key is ``HMAC-SHA256(hmac_secret, canonical_json([stream, spec, canonical rounded values]))``
in hex, where ``spec`` is the canonical JSON of the mechanism name and parameters (so changing ε or the mechanism
starts a new memo) and a rounded value's canonical form is its integer grid index and step exponent. Only memo keys
and noisy report bodies are stored — never raw readings.

Mechanism policy ``auto`` (:func:`choose_mechanism`) picks the candidate with the smallest worst-case per-user
variance: categorical → GRR vs OUE (``variance(0)``); one numeric dimension → HM, PM, Duchi; a numeric group →
k-sampling, Duchi multi-dimensional and (when registered) Haar, compared per coordinate.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from protocols import registry, wire
from protocols.base import os_rng
from protocols.rounding import AlphaRounder, EpochSteps, VolatilityDetector

from .config import AgentConfig, ConfigError, DimensionConfig, StreamConfig

__all__ = [
    "InvalidRecord",
    "Record",
    "StreamPlan",
    "PreparedReport",
    "Pipeline",
    "choose_mechanism",
    "build_stream_plan",
    "memo_key",
    "AUTO_CANDIDATES",
]

#: candidates of the ``auto`` policy, by stream shape
AUTO_CANDIDATES: dict[str, tuple[str, ...]] = {
    "categorical": ("grr", "oue"),
    "scalar": ("hybrid", "piecewise", "duchi"),
    "vector": ("ksampling", "duchi_md", "haar"),
}


class InvalidRecord(ValueError):
    """A reading that cannot be reported. ``reason``: missing | wrong_type | not_finite | out_of_domain."""

    def __init__(self, reason: str, dimension: str, detail: str = "") -> None:
        super().__init__(f"dimension {dimension!r}: {reason}" + (f" ({detail})" if detail else ""))
        self.reason = reason
        self.dimension = dimension


@dataclass(frozen=True)
class Record:
    """One validated reading after clipping and rounding (original units), with memo-key canonical forms."""

    values: dict[str, float | int]
    normalised: dict[str, float]
    canonical: dict[str, list[Any]]
    clipped: tuple[str, ...] = ()
    rounded: tuple[str, ...] = ()


@dataclass(frozen=True)
class StreamPlan:
    """A stream resolved against the registry: its mechanism object, canonical spec and budget."""

    config: StreamConfig
    dimensions: tuple[DimensionConfig, ...]
    mechanism_name: str
    params: dict[str, Any]
    spec: str
    mechanism: Any
    epsilon: float
    cap: float

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kind(self) -> str:
        if self.dimensions[0].kind == "categorical":
            return "categorical"
        return "vector" if len(self.dimensions) > 1 else "scalar"


@dataclass(frozen=True)
class PreparedReport:
    """Everything the report transaction needs for one stream; ``make_body()`` privatizes (memo miss only)."""

    stream: str
    mechanism: str
    spec: str
    memo_key: str
    epsilon: float
    cap: float
    memoize: bool
    make_body: Callable[[], dict[str, Any]] = field(repr=False)


def memo_key(secret: bytes, stream: str, spec: str, canonical_values: list[Any]) -> str:
    """``HMAC-SHA256(secret, stream ‖ spec ‖ canonical rounded value)`` as hex (‖ = canonical JSON array)."""
    msg = b"haarvest-memo-v1\n" + wire.canonical_json([stream, spec, canonical_values])
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


# --- mechanism policy ---------------------------------------------------------------------------------------


def _constructor_params(name: str, stream: StreamConfig, dims: tuple[DimensionConfig, ...], epsilon: float) -> dict[str, Any]:
    cls = registry.mechanism_class(name)
    accepted = inspect.signature(cls.__init__).parameters
    params: dict[str, Any] = {}
    if stream.longitudinal:
        for key in ("epsilon_1", "epsilon_inf"):
            if key in accepted:
                params[key] = getattr(stream, key)
        if "epsilon" in accepted and "epsilon_inf" not in accepted:
            params["epsilon"] = epsilon
    else:
        params["epsilon"] = epsilon
    if dims[0].kind == "categorical":
        if "k" in accepted:
            params["k"] = dims[0].domain_size
    elif "d" in accepted:
        params["d"] = len(dims)
    params.update(stream.params)
    return params


def _worst_variance(mech: Any, kind: str) -> float:
    if kind == "categorical":
        return float(np.max(mech.variance(0.0)))
    wcv = getattr(mech, "worst_case_variance", None)
    if callable(wcv):
        return float(wcv())
    return float(np.max(mech.variance(np.linspace(-1.0, 1.0, 201))))


def choose_mechanism(
    stream: StreamConfig, dims: tuple[DimensionConfig, ...], epsilon: float
) -> tuple[str, dict[str, Any], Any]:
    """Resolve ``stream.mechanism`` to ``(name, constructor params, mechanism)``; ``auto`` = lowest variance."""
    kind = "categorical" if dims[0].kind == "categorical" else ("vector" if len(dims) > 1 else "scalar")
    if stream.mechanism != "auto":
        name = stream.mechanism
        try:
            params = _constructor_params(name, stream, dims, epsilon)
            mech = registry.build(name, **params)
        except (ValueError, ImportError, AttributeError) as exc:
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r}: {exc}") from None
        if kind == "vector" and getattr(mech, "d", len(dims)) != len(dims):
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} does not take {len(dims)}-vectors")
        return name, params, mech
    if stream.longitudinal:
        raise ConfigError(f"stream {stream.name!r}: longitudinal streams need an explicit mechanism name")
    best: tuple[float, str, dict[str, Any], Any] | None = None
    errors = []
    for name in AUTO_CANDIDATES[kind]:
        if name not in registry.MECHANISMS:
            continue
        try:
            params = _constructor_params(name, stream, dims, epsilon)
            mech = registry.build(name, **params)
            var = _worst_variance(mech, kind)
        except Exception as exc:  # noqa: BLE001 - an unavailable candidate is skipped
            errors.append(f"{name}: {exc}")
            continue
        if best is None or var < best[0]:
            best = (var, name, params, mech)
    if best is None:
        raise ConfigError(f"stream {stream.name!r}: no mechanism available for auto ({'; '.join(errors)})")
    return best[1], best[2], best[3]


def build_stream_plan(cfg: AgentConfig, stream: StreamConfig) -> StreamPlan:
    dims = tuple(cfg.dimension(d) for d in stream.dimensions)
    epsilon = cfg.stream_epsilon(stream)
    name, params, mech = choose_mechanism(stream, dims, epsilon)
    spec = wire.canonical_json({"mechanism": name, "params": params}).decode()
    return StreamPlan(
        config=stream,
        dimensions=dims,
        mechanism_name=name,
        params=params,
        spec=spec,
        mechanism=mech,
        epsilon=epsilon,
        cap=cfg.stream_cap(stream),
    )


# --- per-dimension rounding ---------------------------------------------------------------------------------


class _DimRounding:
    """Volatility window (RAM) + epoch steps + life-long α offset for one numeric dimension."""

    def __init__(self, dim: DimensionConfig, state: Mapping[str, Any] | None) -> None:
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
            self.rounder = AlphaRounder.draw(lo, hi, os_rng())
        self.dirty = True

    def observe(self, x: float) -> tuple[float, list[Any], bool]:
        """Update the window with x (already clipped); return (value, canonical form, rounded?)."""
        self.detector.update([x])
        before = self.epochs.current.epoch if self.epochs.current is not None else None
        warming_up = len(self.detector.values()) <= self.detector.window
        if before is None and warming_up:
            plan = None  # first life epoch: plan only once the window is full (scores of 1-2 values mean nothing)
        else:
            try:
                plan = self.epochs.plan(self.index, self.detector.scores)
            except ValueError:
                plan = self.epochs.current  # index behind a restored plan (clock/crash): keep the plan
        self.index += 1
        if plan is None or before != plan.epoch:
            self.dirty = True
        if plan is not None and bool(plan.volatile[0]):
            step = float(plan.steps[0])
            gi = int(self.rounder.grid_index([x], plan.steps)[0])  # type: ignore[union-attr]
            y = min(self.rounder.lo[0] + gi * step, self.rounder.hi[0])  # type: ignore[union-attr]
            return float(y), ["g", int(plan.exponents[0]), gi], True
        return x, ["x", float(x)], False

    def to_state(self) -> dict[str, Any]:
        return {"rounder": self.rounder.to_state(), "epochs": self.epochs.to_state(), "index": self.index}  # type: ignore[union-attr]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


class Pipeline:
    """The device-side pipeline for one agent configuration (see the module docstring).

    ``rounding_state`` is what :meth:`rounding_state` returned before (persisted by the agent); ``None`` draws
    fresh α offsets. Not thread-safe.
    """

    def __init__(
        self,
        config: AgentConfig,
        hmac_secret: bytes,
        rounding_state: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if len(hmac_secret) < 32:
            raise ValueError("the HMAC secret must be at least 32 bytes")
        self.config = config
        self._secret = bytes(hmac_secret)
        self.dimensions = list(config.dimensions)
        self.streams: dict[str, StreamPlan] = {
            s.name: build_stream_plan(config, s) for s in config.effective_streams()
        }
        rounding_state = rounding_state or {}
        self._rounding: dict[str, _DimRounding] = {
            d.name: _DimRounding(d, rounding_state.get(d.name))
            for d in self.dimensions
            if d.kind == "numeric" and d.rounding.enabled
        }
        self.clipped_total: dict[str, int] = {d.name: 0 for d in self.dimensions if d.kind == "numeric"}
        self._round_plans: dict[tuple[str, str], StreamPlan] = {}

    # --- observe ------------------------------------------------------------------------------------------

    def validate(self, reading: Mapping[str, Any]) -> dict[str, float | int]:
        """Check every dimension of ``reading``; raw (unclipped) values, or :class:`InvalidRecord`."""
        if not isinstance(reading, Mapping):
            raise InvalidRecord("wrong_type", "(record)", f"a reading must be a mapping, got {type(reading).__name__}")
        out: dict[str, float | int] = {}
        for d in self.dimensions:
            if d.field not in reading or reading[d.field] is None:
                raise InvalidRecord("missing", d.name, f"field {d.field!r} not in reading")
            raw = reading[d.field]
            if d.kind == "numeric":
                x = _number(raw)
                if x is None:
                    raise InvalidRecord("wrong_type", d.name, f"expected a number, got {type(raw).__name__}")
                if not math.isfinite(x):
                    raise InvalidRecord("not_finite", d.name, repr(raw))
                out[d.name] = x
            else:
                k = d.domain_size
                if isinstance(raw, str) and d.categories is not None:
                    if raw not in d.categories:
                        raise InvalidRecord("out_of_domain", d.name, f"{raw!r} is not one of the categories")
                    out[d.name] = d.categories.index(raw)
                    continue
                x = _number(raw)
                if x is None:
                    raise InvalidRecord("wrong_type", d.name, f"expected a category index, got {type(raw).__name__}")
                if not math.isfinite(x) or x != int(x):
                    raise InvalidRecord("wrong_type" if math.isfinite(x) else "not_finite", d.name, repr(raw))
                if not 0 <= int(x) < k:
                    raise InvalidRecord("out_of_domain", d.name, f"{int(x)} not in [0, {k})")
                out[d.name] = int(x)
        return out

    def observe(self, reading: Mapping[str, Any]) -> Record:
        """Validate, clip, update volatility windows, round and normalise one reading."""
        raw = self.validate(reading)
        values: dict[str, float | int] = {}
        normalised: dict[str, float] = {}
        canonical: dict[str, list[Any]] = {}
        clipped: list[str] = []
        rounded: list[str] = []
        for d in self.dimensions:
            v = raw[d.name]
            if d.kind == "categorical":
                values[d.name] = int(v)
                canonical[d.name] = ["c", int(v)]
                continue
            lo, hi = float(d.lo), float(d.hi)  # type: ignore[arg-type]
            x = min(max(float(v), lo), hi)
            if x != v:
                clipped.append(d.name)
                self.clipped_total[d.name] += 1
            rnd = self._rounding.get(d.name)
            if rnd is not None:
                x, canon, was_rounded = rnd.observe(x)
                if was_rounded:
                    rounded.append(d.name)
            else:
                canon = ["x", x]
            values[d.name] = x
            canonical[d.name] = canon
            normalised[d.name] = min(1.0, max(-1.0, 2.0 * (x - lo) / (hi - lo) - 1.0))
        return Record(values, normalised, canonical, tuple(clipped), tuple(rounded))

    # --- prepare ------------------------------------------------------------------------------------------

    def _mechanism_input(self, plan: StreamPlan, record: Record) -> np.ndarray:
        if plan.kind == "categorical":
            return np.asarray([record.values[plan.dimensions[0].name]], dtype=np.int64)
        t = [record.normalised[d.name] for d in plan.dimensions]
        return np.asarray([t], dtype=float) if plan.kind == "vector" else np.asarray(t, dtype=float)

    def _body_maker(self, plan: StreamPlan, x: np.ndarray) -> Callable[[], dict[str, Any]]:
        def make_body() -> dict[str, Any]:
            out = plan.mechanism.privatize(x, os_rng())
            to_wire = getattr(plan.mechanism, "to_wire", None)
            if callable(to_wire):
                body = to_wire(out[0] if not isinstance(out, tuple) else tuple(o[0] for o in out))
                return body if isinstance(body, dict) else {"report": body}
            if isinstance(out, tuple):
                return {"report": [registry.row_to_json(o[0]) for o in out]}
            return {"report": registry.row_to_json(np.asarray(out)[0])}

        return make_body

    def round_plan(self, name: str, mechanism: str, params: Mapping[str, Any]) -> StreamPlan:
        """The plan for stream ``name`` with the mechanism a round asks for (the coordinator's StreamSpec).

        Accepted only if it spends at most the device's configured ε for the stream and fits the stream's shape
        (``d`` = number of dimensions, ``k`` = domain size); ValueError otherwise. The device's bounds, rounding
        and caps still apply; the memo key includes the round's spec, so it gets its own memo entries.
        """
        base = self.streams[name]
        params = dict(params)
        if mechanism == base.mechanism_name and params == base.params:
            return base
        cache_key = (name, wire.canonical_json({"mechanism": mechanism, "params": params}).decode())
        cached = self._round_plans.get(cache_key)
        if cached is not None:
            return cached
        eps = params.get("epsilon")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < float(eps) <= base.epsilon:
            raise ValueError(f"stream {name!r}: the round asks for ε={eps!r}, the device allows at most {base.epsilon}")
        mech = registry.build(mechanism, **params)
        if base.kind == "categorical" and getattr(mech, "k", None) != base.dimensions[0].domain_size:
            raise ValueError(f"stream {name!r}: the round's k does not match the domain size")
        if base.kind == "vector" and getattr(mech, "d", None) != len(base.dimensions):
            raise ValueError(f"stream {name!r}: the round's d does not match the stream's dimensions")
        if base.kind == "scalar" and getattr(mech, "d", 1) != 1:
            raise ValueError(f"stream {name!r}: the round asks for a vector mechanism for one dimension")
        plan = replace(base, mechanism_name=mechanism, params=params, spec=cache_key[1], mechanism=mech,
                       epsilon=float(eps))
        self._round_plans[cache_key] = plan
        return plan

    def prepare(
        self, record: Record, streams: list[str] | None = None, plans: Mapping[str, StreamPlan] | None = None
    ) -> list[PreparedReport]:
        """One :class:`PreparedReport` per stream (all streams, or the named ones in configuration order);
        ``plans`` replaces the configured plan of some streams for this round (see :meth:`round_plan`)."""
        names = list(self.streams) if streams is None else [s for s in self.streams if s in set(streams)]
        out = []
        for name in names:
            plan = (plans or {}).get(name) or self.streams[name]
            canon = [record.canonical[d.name] for d in plan.dimensions]
            out.append(
                PreparedReport(
                    stream=name,
                    mechanism=plan.mechanism_name,
                    spec=plan.spec,
                    memo_key=memo_key(self._secret, name, plan.spec, canon),
                    epsilon=plan.epsilon,
                    cap=plan.cap,
                    memoize=plan.config.memoize,
                    make_body=self._body_maker(plan, self._mechanism_input(plan, record)),
                )
            )
        return out

    # --- persistence --------------------------------------------------------------------------------------

    @property
    def rounding_dirty(self) -> bool:
        return any(r.dirty for r in self._rounding.values())

    def rounding_state(self, clear_dirty: bool = True) -> dict[str, dict[str, Any]]:
        """Per-dimension α offsets, current epoch plan and reading index (no raw values) for the state DB."""
        states = {name: r.to_state() for name, r in self._rounding.items()}
        if clear_dirty:
            for r in self._rounding.values():
                r.dirty = False
        return states

    def volatility_scores(self) -> dict[str, float]:
        return {name: float(r.detector.scores[0]) for name, r in self._rounding.items()}
