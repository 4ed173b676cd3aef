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
or a *group* of numeric dimensions privatized together by one vector mechanism (``ksampling``, ``duchi_md``, or
``haar`` — :class:`protocols.pipeline.HaarRecord`, the memoized pipeline's record mechanism). The memo key is
``HMAC-SHA256(hmac_secret, canonical_json([stream, spec, canonical rounded values]))`` in hex, where ``spec`` is the
canonical JSON of the mechanism name and parameters (so changing ε or the mechanism starts a new memo) and a
rounded value's canonical form is its integer grid index and step. Only memo keys and noisy report bodies are
stored — never raw readings.

**Longitudinal streams** (``epsilon_1``/``epsilon_inf`` with mechanism ``lgrr`` or ``loloha``, one categorical
dimension) run the :mod:`protocols.longitudinal` client: the memo key is the *protocol's* memo key of the value's
memo slot (the value; LOLOHA's hashed value), keyed by the device HMAC secret; the permanent randomized response is
derived from the same secret (stateless PRR, RAPPOR's pattern), a new key is charged ε∞ and every report — memo hit
or not — is a *fresh* instantaneous randomized response (ε1 per report). LOLOHA's hash seed is derived from the
secret (``HMAC(secret, "haarvest-loloha-seed" ‖ stream)``), so it is fixed for the device's life.

**Mechanism policy** ``auto`` delegates to :func:`protocols.pipeline.choose_mechanism` (the one chooser of the
project: lowest analytic variance, exact variance models): categorical → GRR / OUE / OLH; a numeric stream of d
dimensions → HM k-sampling, Duchi multi-dim or the Haar record mechanism for the stream's query (``params = {"query":
"mean" | "range" | "dyadic" | "total"}``, default ``mean``). For d = 1 the k-sampling winner is HM itself and is
reported as ``hybrid``.

**Round specs** (the coordinator's :class:`protocols.contract.StreamSpec`, the single contract): a device answers
a stream of a round with the round's mechanism only if the spec's kind fits the stream (and the mechanism's class:
a numeric mechanism for numeric dimensions, a frequency oracle for a categorical one), its ``dims`` are the
stream's dimensions in order, its ``labels`` (when given) are the device's categories in order, its ``bounds`` equal the device's declared bounds (a device never adopts other
bounds — :class:`SpecMismatch` ``bounds``), and the *built* mechanism spends at most the device's ε (ε∞ and ε1
for longitudinal streams). A round may select an (ε, δ) mechanism (Gaussian) only if the device's own stream uses
that mechanism and the round's δ is at most the device's (``delta``); the ledger records the δ of every such charge
and caps Σδ by ``ledger.delta_cap``. A spec's ``rounding`` steps (public, planned from earlier aggregates) replace the device's own epoch
steps for that report: ``y = lo + ⌊(x − lo)/step + u⌋·step`` with the device's life-long offset u. For a
dimension the device α-rounds, only its nested grid steps ``(hi − lo)/K_base·2^m`` (m ≥ 0, ≤ hi − lo) are followed;
``null`` (exact) and finer or other steps are refused (``rounding``), so a round cannot multiply memo entries. Heavy-hitter prefix rounds map the value to the round's item
(:func:`protocols.contract.heavy_hitter_items`; the candidates are part of the memo spec). :func:`stream_specs`
gives the specs a device answers exactly as configured.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect
import math
import numbers
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from protocols.contract import CHANGE_BOUNDED, LONGITUDINAL_PROTOCOLS, HeavyHitterSpec, StreamSpec, heavy_hitter_items
from protocols import registry, wire
from protocols.base import FrequencyOracle, NumericMechanism, os_rng
from protocols.errors import ConfigError, InvalidRecord, SpecMismatch
from protocols.rounding import AlphaRounder, EpochSteps, VolatilityDetector

from .config import AgentConfig, DimensionConfig, StreamConfig

__all__ = [
    "InvalidRecord",
    "check_value",
    "Record",
    "StreamPlan",
    "PreparedReport",
    "Pipeline",
    "choose_mechanism",
    "build_stream_plan",
    "memo_key",
    "stream_specs",
    "RoundPlans",
    "SpecMismatch",
    "AUTO_CANDIDATES",
    "privacy_statement",
]

#: what the ``auto`` policy can pick (:func:`protocols.pipeline.choose_mechanism` compares them), by stream shape
AUTO_CANDIDATES: dict[str, tuple[str, ...]] = {
    "categorical": ("grr", "oue", "olh"),
    "scalar": ("hybrid", "duchi_md", "haar"),
    "vector": ("ksampling", "duchi_md", "haar"),
}


@dataclass(frozen=True)
class Record:
    """One validated reading after clipping and rounding (original units), with memo-key canonical forms."""

    values: dict[str, float | int]
    normalised: dict[str, float]
    canonical: dict[str, list[Any]]
    clipped: tuple[str, ...] = ()
    rounded: tuple[str, ...] = ()
    exact: dict[str, float] = field(default_factory=dict, repr=False)  # clipped, unrounded (RAM only)


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
    rounding: tuple[float | None, ...] | None = None
    epsilon_1: float | None = None
    heavy_hitters: HeavyHitterSpec | None = None
    delta: float = 0.0  # δ of an (ε, δ) mechanism (Gaussian); 0 for pure ε-LDP
    unit: str = "device"  # the privacy unit the ledger's charges are true for (edge_agent.config)
    memoize: bool = False  # re-send memoized reports (value unit only)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def charge(self) -> float:
        """ε the ledger charges for one report of this plan.

        ``value`` unit: ε (ε∞ for longitudinal chains) per *new* memo entry, 0 for a memo hit.
        ``device`` unit: every report is charged, and the charge bounds the report's contribution to the
        whole-transcript log-likelihood ratio against any other readings: a fresh mechanism's ε (sequential
        composition over independent randomizations); for a longitudinal chain the IRR's ε for an arbitrary change
        of its input (``irr_input_epsilon``): the PRR table is drawn independently of the data, so conditioned on
        it the reports are independent IRRs and each one changes the ratio by at most that factor
        (:mod:`protocols.longitudinal.base`, bound 2).
        """
        if self.change_bounded:  # the most one tree can charge (per report: CategoricalDDRM.step_charge)
            return float(self.mechanism.device_epsilon(self.mechanism.horizon))
        if self.unit == "device" and self.longitudinal:
            return float(self.mechanism.irr_input_epsilon)
        return float(self.epsilon)

    @property
    def change_bounded(self) -> bool:
        """A DDRM stream: cost grows with the value's changes (up to a declared budget), not with the reports."""
        return self.mechanism_name in CHANGE_BOUNDED

    @property
    def kind(self) -> str:
        """The stream's shape: ``categorical``, ``scalar`` (one numeric dimension) or ``vector``."""
        if self.dimensions[0].kind == "categorical":
            return "categorical"
        return "vector" if len(self.dimensions) > 1 else "scalar"

    @property
    def longitudinal(self) -> bool:
        return self.mechanism_name in LONGITUDINAL_PROTOCOLS

    @property
    def spec_kind(self) -> str:
        """The coordinator's :class:`~protocols.contract.StreamSpec` kind of this plan."""
        if self.longitudinal:
            return "longitudinal"
        if self.kind == "categorical":
            return "frequency"
        if self.mechanism_name == "haar":
            return "haar"
        return "numeric" if self.kind == "scalar" and getattr(self.mechanism, "d", 1) == 1 else "vector"

    def stream_spec(self) -> dict[str, Any]:
        """This plan as the coordinator's StreamSpec (JSON-ready): what a round must send for the device to answer
        the stream exactly as configured."""
        out: dict[str, Any] = {"kind": self.spec_kind, "mechanism": self.mechanism_name, "params": dict(self.params),
                               "dims": [d.name for d in self.dimensions]}
        if self.kind == "categorical":
            if self.dimensions[0].categories is not None:
                out["labels"] = list(self.dimensions[0].categories)
        else:
            out["bounds"] = [[float(d.lo), float(d.hi)] for d in self.dimensions]  # type: ignore[arg-type]
            if any(d.units for d in self.dimensions):
                out["units"] = [d.units or "" for d in self.dimensions]
        if self.rounding is not None:
            out["rounding"] = list(self.rounding)
        if self.heavy_hitters is not None:
            out["heavy_hitters"] = self.heavy_hitters.model_dump()
        out["unit"] = self.unit
        return StreamSpec.model_validate(out).model_dump(mode="json", exclude_none=True)


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
    refresh: bool = False
    delta: float = 0.0
    unit: str = "device"
    until: float | None = None  # the end of the time the charge covers (a DDRM tree's end); None: the report
    #: (key, state) to persist in the report's own transaction, and what to do once it committed (DDRM trees)
    state: tuple[str, dict[str, Any]] | None = None
    on_commit: Callable[[], None] | None = field(default=None, repr=False)


def privacy_statement(plan: StreamPlan) -> dict[str, Any]:
    """What the ledger's number for ``plan``'s stream means, in words and numbers (``agent status``, docs)."""
    out: dict[str, Any] = {"unit": plan.unit, "mechanism": plan.mechanism_name}
    if plan.change_bounded:
        m = plan.mechanism
        out["charge_per_tree"] = plan.charge
        out["bounds"] = (f"everything this device released in a tree of {m.horizon} reports, against any other "
                         f"readings: ε·min(M, k·nodes released), M = {m.max_nonzero} non-zero nodes "
                         f"({m.changes} changes)")
        out["does_not_hide"] = ("nothing beyond the charged ε; more changes than declared are reported as no change "
                                "(a bias of the estimate, not a larger loss)")
        return out
    if plan.unit == "device":
        out["charge_per_report"] = plan.charge
        out["bounds"] = ("everything this device released in the budget window, against any other readings: "
                         "every report is a fresh randomization charged its ε")
        out["does_not_hide"] = "nothing beyond the charged ε (user-level LDP over the window)"
        return out
    out["charge_per_new_value"] = plan.charge
    out["bounds"] = "the loss about each distinct (rounded) value: ε per new memo entry, 0 for a memo hit"
    if plan.longitudinal:
        irr = float(plan.mechanism.irr_input_epsilon)
        out["does_not_hide"] = (f"when the value changes: a change time is protected only by the fresh IRR, up to "
                                f"ε = {irr:.4g} per report whose memo slot differs; a transcript can lose more than "
                                f"the total charged (e.g. L-GRR(1, 0.9, k=4), (0,0,1,1) vs (0,2,0,2): 6.93 "
                                f"against 2)")
    elif plan.memoize:
        out["does_not_hide"] = ("when the value changes: a memo hit re-sends the first report verbatim, so readings "
                                "(x, x) and (x, y) are told apart with certainty (unbounded loss about change times)")
    else:
        out["does_not_hide"] = "nothing beyond the charged ε: memoization is off, every report is charged"
    return out


def memo_key(secret: bytes, stream: str, spec: str, canonical_values: list[Any]) -> str:
    """``HMAC-SHA256(secret, stream ‖ spec ‖ canonical rounded value)`` as hex (‖ = canonical JSON array)."""
    msg = b"haarvest-memo-v1\n" + wire.canonical_json([stream, spec, canonical_values])
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


# --- mechanism policy ---------------------------------------------------------------------------------------


_SPEC_TEXTS: "OrderedDict[int, tuple[StreamSpec, str]]" = OrderedDict()


def _spec_text(spec: StreamSpec) -> str:
    """Canonical JSON of a validated round spec, remembered for the last few spec objects: the devices a process
    hosts answer the same round from the same validated spec objects (edge_agent.flower_app.RoundCheck), so it is
    serialised once per round, not once per device (the entry holds the object, so its id is not reused)."""
    hit = _SPEC_TEXTS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    text = wire.canonical_json(spec.model_dump(mode="json", exclude_none=True)).decode()
    _SPEC_TEXTS[id(spec)] = (spec, text)
    while len(_SPEC_TEXTS) > 64:
        _SPEC_TEXTS.popitem(last=False)
    return text


@functools.lru_cache(maxsize=128)
def _init_parameters(cls: type) -> frozenset[str]:
    """Names of a mechanism class's constructor parameters (cached: inspecting a signature costs ~60 µs)."""
    return frozenset(inspect.signature(cls.__init__).parameters)


def _constructor_params(name: str, stream: StreamConfig, dims: tuple[DimensionConfig, ...], epsilon: float) -> dict[str, Any]:
    accepted = _init_parameters(registry.mechanism_class(name))
    params: dict[str, Any] = {"epsilon": epsilon}
    if dims[0].kind == "categorical":
        if "k" in accepted:
            params["k"] = dims[0].domain_size
    elif "d" in accepted:
        params["d"] = len(dims)
    params.update(stream.params)
    return params


def _resolved(name: str, params: dict[str, Any], mech: Any) -> dict[str, Any]:
    """Constructor parameters with every automatic choice resolved (HaarRecord: mean mechanism and split), so the
    coordinator rebuilds exactly the device's mechanism from the stream spec."""
    if name == "haar":
        return {"epsilon": float(mech.epsilon), "d": int(mech.d), "mean_mechanism": mech.mean_mechanism,
                "detail_mechanism": mech.detail_mechanism, "split": float(mech.split)}
    return params


@functools.lru_cache(maxsize=256)
def _auto_choice(epsilon: float, d: int, query: str, k: int | None) -> tuple[str, str, Any]:
    """``protocols.pipeline.choose_mechanism`` (cached: it is analytic, and agents of a fleet share the answer)."""
    from protocols.pipeline import choose_mechanism as choose

    ch = choose(epsilon, d, query, k)
    if ch.name == "ksampling" and d == 1:  # k-sampling of one coordinate is its base mechanism itself
        base = str(ch.params.get("base", "hybrid"))
        params: dict[str, Any] = {"epsilon": float(epsilon)}
        return base, wire.canonical_json(params).decode(), registry.build(base, **params)
    return ch.name, wire.canonical_json(ch.params).decode(), ch.mechanism


def _longitudinal_protocol(stream: StreamConfig, dims: tuple[DimensionConfig, ...]) -> tuple[str, dict[str, Any], Any]:
    from protocols.longitudinal import protocol_from_params

    name = stream.mechanism
    if name not in LONGITUDINAL_PROTOCOLS:
        raise ConfigError(
            f"stream {stream.name!r}: longitudinal streams need an explicit mechanism name, one of "
            f"{', '.join(LONGITUDINAL_PROTOCOLS)} (got {name!r})"
        )
    if dims[0].kind != "categorical" or len(dims) != 1:
        raise ConfigError(f"stream {stream.name!r}: a longitudinal stream has one categorical dimension")
    params = {"epsilon_inf": stream.epsilon_inf, "epsilon_1": stream.epsilon_1, "k": dims[0].domain_size,
              **stream.params}
    try:
        proto = protocol_from_params(LONGITUDINAL_PROTOCOLS[name], params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"stream {stream.name!r}: mechanism {name!r}: bad parameters: {exc}") from None
    return name, proto.params(), proto


def _change_bounded_protocol(stream: StreamConfig, dims: tuple[DimensionConfig, ...],
                             epsilon: float) -> tuple[str, dict[str, Any], Any]:
    """A ``ddrm`` stream: :class:`protocols.longitudinal.CategoricalDDRM` with ε per node and ``params = {"horizon":
    reports per tree, "changes": changes per tree}`` on one categorical dimension."""
    from protocols.longitudinal import CategoricalDDRM

    if dims[0].kind != "categorical" or len(dims) != 1:
        raise ConfigError(f"stream {stream.name!r}: a ddrm stream has one categorical dimension")
    extra = set(stream.params) - {"horizon", "changes"}
    if extra or not {"horizon", "changes"} <= set(stream.params):
        raise ConfigError(f"stream {stream.name!r}: ddrm takes params.horizon (reports per tree) and params.changes "
                          f"(value changes per tree), got {sorted(stream.params)}")
    try:
        proto = CategoricalDDRM(epsilon, dims[0].domain_size, int(stream.params["horizon"]),
                                int(stream.params["changes"]))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"stream {stream.name!r}: mechanism 'ddrm': bad parameters: {exc}") from None
    return "ddrm", proto.params(), proto


def choose_mechanism(
    stream: StreamConfig, dims: tuple[DimensionConfig, ...], epsilon: float
) -> tuple[str, dict[str, Any], Any]:
    """Resolve ``stream.mechanism`` to ``(name, constructor params, mechanism)``.

    ``auto`` delegates to :func:`protocols.pipeline.choose_mechanism`; longitudinal streams build their
    :mod:`protocols.longitudinal` protocol (the ``mechanism`` is then the protocol object).
    """
    kind = "categorical" if dims[0].kind == "categorical" else ("vector" if len(dims) > 1 else "scalar")
    if stream.longitudinal:
        return _longitudinal_protocol(stream, dims)
    if stream.mechanism in CHANGE_BOUNDED:
        return _change_bounded_protocol(stream, dims, epsilon)
    if stream.mechanism in LONGITUDINAL_PROTOCOLS:
        raise ConfigError(f"stream {stream.name!r}: mechanism {stream.mechanism!r} needs epsilon_1 and epsilon_inf")
    if stream.mechanism != "auto":
        name = stream.mechanism
        try:
            params = _constructor_params(name, stream, dims, epsilon)
            mech = registry.build(name, **params)
        except (ValueError, ImportError, AttributeError) as exc:
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r}: {exc}") from None
        if kind == "vector" and getattr(mech, "d", len(dims)) != len(dims):
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} does not take {len(dims)}-vectors")
        if kind == "categorical" and not hasattr(mech, "k"):
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} is not a frequency oracle")
        return name, _resolved(name, params, mech), mech
    extra = set(stream.params) - {"query"}
    if extra:
        raise ConfigError(f"stream {stream.name!r}: mechanism 'auto' takes only params.query, got {sorted(extra)}")
    query = stream.params.get("query", "frequency" if kind == "categorical" else "mean")
    k = dims[0].domain_size if kind == "categorical" else None
    try:
        name, params_json, mech = _auto_choice(float(epsilon), len(dims), str(query), k)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"stream {stream.name!r}: auto: {exc}") from None
    import json

    return name, json.loads(params_json), mech


def build_stream_plan(cfg: AgentConfig, stream: StreamConfig) -> StreamPlan:
    dims = tuple(cfg.dimension(d) for d in stream.dimensions)
    epsilon = cfg.stream_epsilon(stream)
    name, params, mech = choose_mechanism(stream, dims, epsilon)
    spec = wire.canonical_json({"mechanism": name, "params": params}).decode()
    delta = 0.0 if stream.longitudinal else _mechanism_delta(mech)
    if delta > 0:
        cap = cfg.ledger.delta_cap
        if cap is None or delta > cap:
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} has δ = {delta:g}; set ledger.delta_cap "
                              f"(the most Σδ the device spends) to at least that (now {cap})")
    plan = StreamPlan(
        config=stream,
        dimensions=dims,
        mechanism_name=name,
        params=params,
        spec=spec,
        mechanism=mech,
        epsilon=epsilon,
        cap=cfg.stream_cap(stream),
        epsilon_1=float(stream.epsilon_1) if stream.longitudinal else (  # type: ignore[arg-type]
            epsilon if name in CHANGE_BOUNDED else None),
        delta=delta,
        unit=cfg.stream_unit(stream),
        memoize=cfg.stream_memoizes(stream),
    )
    if plan.change_bounded and plan.unit != "device":
        raise ConfigError(f"stream {stream.name!r}: a ddrm stream is accounted under the device unit (its charge "
                          f"bounds everything the device releases; there is no memo)")
    if plan.charge > plan.cap:
        raise ConfigError(f"stream {stream.name!r}: one report costs ε = {plan.charge:.6g} under the "
                          f"{plan.unit!r} unit, more than the stream's cap {plan.cap:g}")
    return plan


def _mechanism_delta(mech: Any) -> float:
    """δ of a built mechanism (0 for pure ε-LDP ones)."""
    return float(getattr(mech, "delta", 0.0) or 0.0)


def stream_specs(cfg: AgentConfig) -> dict[str, dict[str, Any]]:
    """``{stream: StreamSpec}`` (JSON-ready) for every configured stream — what a coordinator's round must ask for
    this device to answer with its configured mechanisms; the single source for building rounds."""
    return {s.name: build_stream_plan(cfg, s).stream_spec() for s in cfg.effective_streams()}


_BOUNDS_RTOL = 1e-9


def _same_bound(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=_BOUNDS_RTOL, abs_tol=1e-12)


def plan_for_spec(base: StreamPlan, spec: StreamSpec) -> StreamPlan:
    """The plan for stream ``base`` following a round's :class:`StreamSpec`, or :class:`SpecMismatch` (see the
    module docstring: kind, dims, bounds, ε, shape and rounding are checked; the device's caps still apply)."""
    name = base.name
    if spec.unit != base.unit:
        raise SpecMismatch("unit", f"stream {name!r} is accounted under the {base.unit!r} unit; the round asks for "
                                   f"{spec.unit!r}")
    expected = {"categorical": ("longitudinal",) if base.longitudinal else ("frequency",),
                "scalar": ("numeric", "vector", "haar"), "vector": ("vector", "haar")}[base.kind]
    if spec.kind not in expected:
        raise SpecMismatch("kind", f"stream {name!r} is {base.kind}; the round asks for a {spec.kind} stream")
    dims = [d.name for d in base.dimensions]
    if list(spec.dims) != dims:
        raise SpecMismatch("dims", f"stream {name!r} has dims {dims}, the round names {list(spec.dims)}")
    if spec.bounds is not None:
        for (lo, hi), d in zip(spec.bounds, base.dimensions):
            if not (_same_bound(lo, d.lo) and _same_bound(hi, d.hi)):  # type: ignore[arg-type]
                raise SpecMismatch("bounds", f"stream {name!r}: dimension {d.name!r} is declared on "
                                             f"[{d.lo}, {d.hi}], the round asks for [{lo}, {hi}]")
    if base.kind == "categorical" and spec.labels is not None:
        own = base.dimensions[0].categories
        if own is None or list(spec.labels) != list(own):
            raise SpecMismatch("labels", f"stream {name!r}: the round's labels differ from the device's categories")
    hh = spec.heavy_hitters
    if hh is not None and base.dimensions[0].domain_size > (1 << hh.bits):
        raise SpecMismatch("shape", f"stream {name!r}: values in [0, {base.dimensions[0].domain_size}) do not fit "
                                    f"in {hh.bits} bits")
    tol = 1e-12
    if spec.epsilon > base.epsilon * (1 + tol):
        raise SpecMismatch("epsilon", f"stream {name!r}: the round asks for ε={spec.epsilon:g}, "
                                      f"the device allows at most {base.epsilon:g}")
    if spec.kind == "longitudinal":
        eps1 = float(spec.params.get("epsilon_1", math.inf))
        if base.epsilon_1 is None or eps1 > base.epsilon_1 * (1 + tol):
            raise SpecMismatch("epsilon", f"stream {name!r}: the round asks for ε1={eps1:g}, "
                                          f"the device allows at most {base.epsilon_1}")
    rounding: tuple[float | None, ...] | None = None
    if spec.rounding is not None:
        if base.kind == "categorical":
            raise SpecMismatch("rounding", f"stream {name!r} is categorical")
        rounding = tuple(_round_step(name, d, step) for step, d in zip(spec.rounding, base.dimensions))
    mech_name = spec.wire_mechanism
    params = dict(spec.params)
    if mech_name == base.mechanism_name and params == base.params and hh is None:
        return replace(base, rounding=rounding) if rounding is not None else base
    try:
        mech = spec.build()
    except (ValueError, ImportError, AttributeError, TypeError) as exc:
        raise SpecMismatch("mechanism", f"stream {name!r}: {exc}") from None
    if spec.kind == "frequency" and not isinstance(mech, FrequencyOracle):
        raise SpecMismatch("mechanism", f"stream {name!r} is categorical; {mech_name!r} is not a frequency oracle")
    if base.kind != "categorical" and not isinstance(mech, NumericMechanism):
        raise SpecMismatch("mechanism", f"stream {name!r} is numeric; {mech_name!r} is not a numeric mechanism")
    if base.kind == "categorical":
        k = hh.k if hh is not None else base.dimensions[0].domain_size
        if getattr(mech, "k", None) != k:
            raise SpecMismatch("shape", f"stream {name!r}: the round's k does not match the domain size ({k})")
    elif spec.kind == "numeric":
        if getattr(mech, "d", 1) != 1 or not hasattr(mech, "variance"):
            raise SpecMismatch("shape", f"stream {name!r}: the round asks for a vector mechanism for one dimension")
    elif getattr(mech, "d", None) != len(base.dimensions):
        raise SpecMismatch("shape", f"stream {name!r}: the round's d does not match the stream's dimensions")
    # the BUILT mechanism's guarantee is what privatize spends: ε within the device's, and no (ε, δ) mechanism
    # unless the device's own configuration uses that mechanism with at least that small a δ
    epsilon = float(spec.epsilon)
    if spec.kind != "longitudinal":
        epsilon = float(getattr(mech, "epsilon", math.inf))
        if not epsilon <= base.epsilon * (1 + tol):
            raise SpecMismatch("epsilon", f"stream {name!r}: the round's mechanism spends ε={epsilon:g}, "
                                          f"the device allows at most {base.epsilon:g}")
    delta = 0.0 if spec.kind == "longitudinal" else _mechanism_delta(mech)
    if delta > 0 and (mech_name != base.mechanism_name or not delta <= base.delta * (1 + tol)):
        raise SpecMismatch("delta", f"stream {name!r}: the round asks for an (ε, δ) mechanism ({mech_name}, "
                                    f"δ={delta:g}); the device's own is {base.mechanism_name} with δ={base.delta:g}")
    if spec.kind == "longitudinal":
        params = mech.params()
    spec_data: dict[str, Any] = {"mechanism": mech_name, "params": params}
    if hh is not None:  # the items depend on the candidates: they are part of the memo spec
        spec_data["heavy_hitters"] = hh.model_dump()
    spec_json = wire.canonical_json(spec_data).decode()
    plan = replace(base, mechanism_name=mech_name, params=params, spec=spec_json, mechanism=mech,
                   epsilon=epsilon, delta=delta, rounding=rounding, heavy_hitters=hh,
                   epsilon_1=float(params["epsilon_1"]) if spec.kind == "longitudinal" else None)
    if plan.charge > base.charge * (1 + tol):  # e.g. a chain with a smaller ε∞ but the same ε1 has a larger IRR ε
        raise SpecMismatch("epsilon", f"stream {name!r}: one report of the round's mechanism costs "
                                      f"ε={plan.charge:.6g} under the {base.unit!r} unit, the device's own "
                                      f"{base.charge:.6g}")
    return plan


_STEP_RTOL = 1e-9


def _round_step(stream: str, dim: DimensionConfig, step: float | None) -> float | None:
    """The rounding step a round asks for on ``dim``, checked against the device's own grids.

    A dimension the device α-rounds accepts only its nested steps ``(hi − lo)/K_base · 2^m`` (m ≥ 0 integer,
    step ≤ hi − lo; relative tolerance 1e-9, snapped to the exact value): never ``null`` (the exact value) nor a
    finer step — each distinct rounded value is a new memo entry, so a finer grid would let a round spend the
    device's budget on values it never meant to distinguish. A dimension the device does not round reports its
    exact value whatever the round asks (a step larger than its range is still malformed).
    """
    lo, hi = float(dim.lo), float(dim.hi)  # type: ignore[arg-type]
    width = hi - lo
    if step is not None and step > width * (1 + _STEP_RTOL):
        raise SpecMismatch("rounding", f"stream {stream!r}: step {step} exceeds the range of {dim.name!r}")
    if not dim.rounding.enabled:
        return None if step is None else float(step)
    if step is None:
        raise SpecMismatch("rounding", f"stream {stream!r}: {dim.name!r} is α-rounded on this device; the round "
                                       "may not ask for its exact value")
    base = width / dim.rounding.k_base
    ratio = float(step) / base
    m = round(math.log2(ratio)) if ratio >= 1 - _STEP_RTOL else -1
    if m < 0 or not math.isclose(base * 2.0**m, float(step), rel_tol=_STEP_RTOL):
        raise SpecMismatch("rounding", f"stream {stream!r}: step {step} of {dim.name!r} is not one of the device's "
                                       f"nested grid steps {base:g}·2^m")
    return min(base * 2.0**m, width)


@dataclass
class RoundPlans:
    """How a device answers one round: ``streams`` to report (None = all), ``plans`` replacing the configured
    plans of some streams, ``refused`` streams as ``(stream, reason)`` and ``unknown`` stream names."""

    streams: list[str] | None
    plans: dict[str, StreamPlan] = field(default_factory=dict)
    refused: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


# --- per-dimension rounding ---------------------------------------------------------------------------------


class _DimRounding:
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
        if plan is not None and before != plan.epoch:  # a new epoch plan: persist it (with the reading index)
            self.dirty = True
        # (while the first window fills there is no plan to keep: the reading index alone is not written each
        # reading — after a restart the window refills anyway, and epochs count from the last index written)
        if plan is not None and bool(plan.volatile[0]):
            step = float(plan.steps[0])
            gi = int(self.rounder.grid_index([x], plan.steps)[0])  # type: ignore[union-attr]
            y = min(self.rounder.lo[0] + gi * step, self.rounder.hi[0])  # type: ignore[union-attr]
            return float(y), ["g", int(plan.exponents[0]), gi], True
        return x, ["x", float(x)], False

    def round_with(self, x: float, step: float) -> tuple[float, list[Any]]:
        """α-round x (clipped) with a step a round asks for, using the life-long offset u.

        Canonical form ``["g", m, i]`` when the step is the device's nested grid step ``(hi−lo)/K_base·2^m`` (so it
        shares memo entries with the device's own plans), else ``["s", step, i]``.
        """
        rounder = self.rounder
        assert rounder is not None
        gi = int(rounder.grid_index([x], [step])[0])
        y = float(min(rounder.lo[0] + gi * step, rounder.hi[0]))
        base = (float(rounder.hi[0]) - float(rounder.lo[0])) / self.epochs.k_base
        m = round(math.log2(step / base)) if step >= base * (1 - 1e-9) else -1
        if m >= 0 and math.isclose(base * 2.0**m, step, rel_tol=1e-9):
            return y, ["g", int(m), gi]
        return y, ["s", float(step), gi]

    def to_state(self) -> dict[str, Any]:
        return {"rounder": self.rounder.to_state(), "epochs": self.epochs.to_state(), "index": self.index}  # type: ignore[union-attr]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def check_value(d: DimensionConfig, raw: Any) -> float | int:
    """One dimension's value of a reading, checked: a finite real number (numeric; unclipped), or a category index
    in [0, k) or one of the configured labels (categorical, returned as its index); else :class:`InvalidRecord`."""
    if d.kind == "numeric":
        x = _number(raw)
        if x is None:
            raise InvalidRecord("wrong_type", d.name, f"expected a number, got {type(raw).__name__}", raw)
        if not math.isfinite(x):
            raise InvalidRecord("not_finite", d.name, "not a finite number", raw)
        return x
    k = d.domain_size
    if isinstance(raw, str) and d.categories is not None:
        if raw not in d.categories:
            raise InvalidRecord("out_of_domain", d.name, "the label is not one of the categories", raw)
        return d.categories.index(raw)
    x = _number(raw)
    if x is None:
        raise InvalidRecord("wrong_type", d.name, f"expected a category index, got {type(raw).__name__}", raw)
    if not math.isfinite(x) or x != int(x):
        raise InvalidRecord("wrong_type" if math.isfinite(x) else "not_finite", d.name,
                            "not an integer category index", raw)
    if not 0 <= int(x) < k:
        raise InvalidRecord("out_of_domain", d.name, f"the category index is not in [0, {k})", raw, f"[0, {k})")
    return int(x)


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
        #: the device's noise source: ONE generator seeded from OS entropy when the pipeline is built (never a fixed
        #: seed), drawn from by every privatization and α-offset draw (a fresh OS-seeded generator costs ~60 µs)
        self.rng = os_rng()
        rounding_state = rounding_state or {}
        self._rounding: dict[str, _DimRounding] = {
            d.name: _DimRounding(d, rounding_state.get(d.name), self.rng)
            for d in self.dimensions
            if d.kind == "numeric" and d.rounding.enabled
        }
        self.clipped_total: dict[str, int] = {d.name: 0 for d in self.dimensions if d.kind == "numeric"}
        self._round_plans: dict[tuple[str, str], StreamPlan] = {}
        self._last_spec: dict[str, tuple[StreamSpec, StreamPlan]] = {}
        self._clients: dict[tuple[str, str], Any] = {}
        #: ddrm streams' trees ({"spec", "start", "client"}), persisted with the reports (rounding table, key
        #: "stream:<name>"): the client state holds the categories at level boundaries, which never leave the device
        self._trees: dict[str, dict[str, Any]] = {
            k.split(":", 1)[1]: dict(v) for k, v in (rounding_state or {}).items() if k.startswith("stream:")
        }

    # --- observe ------------------------------------------------------------------------------------------

    def validate(self, reading: Mapping[str, Any]) -> dict[str, float | int]:
        """Check every dimension of ``reading``; raw (unclipped) values, or :class:`InvalidRecord`."""
        if not isinstance(reading, Mapping):
            raise InvalidRecord("wrong_type", "(record)", f"a reading must be a mapping, got {type(reading).__name__}")
        out: dict[str, float | int] = {}
        for d in self.dimensions:
            if d.field not in reading or reading[d.field] is None:
                raise InvalidRecord("missing", d.name, f"field {d.field!r} not in reading")
            out[d.name] = check_value(d, reading[d.field])
        return out

    def observe(self, reading: Mapping[str, Any]) -> Record:
        """Validate, clip, update volatility windows, round and normalise one reading."""
        raw = self.validate(reading)
        values: dict[str, float | int] = {}
        normalised: dict[str, float] = {}
        canonical: dict[str, list[Any]] = {}
        exact: dict[str, float] = {}
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
            exact[d.name] = x
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
        return Record(values, normalised, canonical, tuple(clipped), tuple(rounded), exact)

    # --- prepare ------------------------------------------------------------------------------------------

    def _view(self, plan: StreamPlan, record: Record) -> tuple[list[Any], list[float]]:
        """(canonical memo-key forms, normalised values) of the plan's dimensions — with the round's rounding
        steps when the plan has them (see :meth:`_DimRounding.round_with`)."""
        canon = [record.canonical[d.name] for d in plan.dimensions]
        if plan.kind == "categorical":
            if plan.heavy_hitters is not None:
                canon = [["h", self._item(plan, record)]]
            return canon, []
        t = [record.normalised[d.name] for d in plan.dimensions]
        if plan.rounding is None:
            return canon, t
        for j, (d, step) in enumerate(zip(plan.dimensions, plan.rounding)):
            x = record.exact.get(d.name)
            if x is None:
                continue
            rnd = self._rounding.get(d.name)
            if step is None or rnd is None:  # the round asks for the exact value (or the dimension never rounds)
                y, canon[j] = x, ["x", x]
            else:
                y, canon[j] = rnd.round_with(x, step)
            lo, hi = float(d.lo), float(d.hi)  # type: ignore[arg-type]
            t[j] = min(1.0, max(-1.0, 2.0 * (y - lo) / (hi - lo) - 1.0))
        return canon, t

    @staticmethod
    def _item(plan: StreamPlan, record: Record) -> int:
        """A heavy-hitter round's oracle item for the value (:func:`protocols.contract.heavy_hitter_items`)."""
        assert plan.heavy_hitters is not None
        return int(heavy_hitter_items(plan.heavy_hitters, [record.values[plan.dimensions[0].name]])[0])

    def _mechanism_input(self, plan: StreamPlan, record: Record, t: list[float]) -> np.ndarray:
        if plan.kind == "categorical":
            value = self._item(plan, record) if plan.heavy_hitters is not None \
                else record.values[plan.dimensions[0].name]
            return np.asarray([value], dtype=np.int64)
        # vector mechanisms (they have ``d``: k-sampling, Duchi multi-dim, HaarRecord) take one row of d values
        return np.asarray([t], dtype=float) if hasattr(plan.mechanism, "d") else np.asarray(t, dtype=float)

    def _body_maker(self, plan: StreamPlan, x: np.ndarray) -> Callable[[], dict[str, Any]]:
        def make_body() -> dict[str, Any]:
            out = plan.mechanism.privatize(x, self.rng)
            to_wire = getattr(plan.mechanism, "to_wire", None)
            if callable(to_wire):
                body = to_wire(out[0] if not isinstance(out, tuple) else tuple(o[0] for o in out))
                return body if isinstance(body, dict) else {"report": body}
            if isinstance(out, tuple):
                return {"report": [registry.row_to_json(o[0]) for o in out]}
            return {"report": registry.row_to_json(np.asarray(out)[0])}

        return make_body

    def _client(self, plan: StreamPlan) -> Any:
        """The :mod:`protocols.longitudinal` client of a longitudinal plan (cached; stateless PRR keyed by the
        device secret, fresh IRR randomness from the OS; LOLOHA's hash seed derived from the secret)."""
        key = (plan.name, plan.spec)
        client = self._clients.get(key)
        if client is None:
            kwargs: dict[str, Any] = {"secret": self._secret, "stream": plan.name, "memo_style": "stateless",
                                      "rng": os_rng()}
            if getattr(plan.mechanism, "device_parameter", None) == "seed":
                digest = hmac.new(self._secret, b"haarvest-loloha-seed\n" + plan.name.encode(), hashlib.sha256).digest()
                kwargs["seed"] = int.from_bytes(digest[:8], "big") >> 2  # in [0, 2^62)
            client = plan.mechanism.client(**kwargs)
            self._clients[key] = client
        return client

    def _longitudinal_report(self, plan: StreamPlan, record: Record) -> tuple[str, Callable[[], dict[str, Any]]]:
        """(protocol memo key, body maker): each call of the maker is a fresh IRR of the slot's memoized PRR."""
        client = self._client(plan)
        value = int(record.values[plan.dimensions[0].name])
        first = client.report(value)
        pending = [first]

        def make_body() -> dict[str, Any]:
            rep = pending.pop() if pending else client.report(value)
            return {"report": registry.row_to_json(np.asarray(rep.report))}

        return str(first.memo_key), make_body

    def round_plan(self, name: str, mechanism: str, params: Mapping[str, Any]) -> StreamPlan:
        """Compatibility shim: the plan for stream ``name`` with a round's ``mechanism``/``params`` and the stream's
        own dims and bounds (see :meth:`plan_for` for the full StreamSpec check). ValueError if refused."""
        base = self.streams[name]
        data: dict[str, Any] = {k: v for k, v in base.stream_spec().items() if k not in ("mechanism", "params")}
        data.update(mechanism=mechanism, params=dict(params))
        if mechanism == "haar":
            data["kind"] = "haar"
        elif data["kind"] == "haar":
            data["kind"] = "vector" if len(base.dimensions) > 1 else "numeric"
        try:
            spec = StreamSpec.model_validate(data)
        except ValueError as exc:
            raise SpecMismatch("malformed", str(exc)) from None
        return self.plan_for(name, spec)

    def plan_for(self, name: str, spec: StreamSpec | Mapping[str, Any]) -> StreamPlan:
        """The plan for stream ``name`` following a round's StreamSpec (:func:`plan_for_spec`; cached)."""
        if not isinstance(spec, StreamSpec):
            try:
                spec = StreamSpec.model_validate(dict(spec))
            except (ValueError, TypeError) as exc:
                raise SpecMismatch("malformed", str(exc).splitlines()[0]) from None
        else:
            last = self._last_spec.get(name)
            if last is not None and last[0] is spec:  # the same validated spec object as last time: same plan
                return last[1]
        cache_key = (name, _spec_text(spec))
        plan = self._round_plans.get(cache_key)
        if plan is None:
            plan = plan_for_spec(self.streams[name], spec)
            if len(self._round_plans) > 256:
                self._round_plans.clear()
            self._round_plans[cache_key] = plan
        self._last_spec[name] = (spec, plan)
        return plan

    def round_plans(self, params: Mapping[str, Any]) -> RoundPlans:
        """How to answer a round with ``RoundConfig.params``: ``streams`` absent (every stream, as configured), a
        list of stream names, or the coordinator's ``{stream: StreamSpec}`` mapping (each spec checked by
        :meth:`plan_for`; a refused stream is skipped with its reason). ValueError if ``streams`` is malformed."""
        streams = params.get("streams") if isinstance(params, Mapping) else None
        if streams is None:
            return RoundPlans(None)
        if isinstance(streams, list):
            if not all(isinstance(s, str) for s in streams):
                raise ValueError("params.streams must be a list of names or a mapping of stream specs")
            return RoundPlans([s for s in streams if s in self.streams], unknown=[s for s in streams
                                                                                  if s not in self.streams])
        if not isinstance(streams, Mapping):
            raise ValueError("params.streams must be a list of names or a mapping of stream specs")
        out = RoundPlans([])
        for name, spec in streams.items():
            if name not in self.streams:
                out.unknown.append(str(name))
                continue
            try:
                out.plans[name] = self.plan_for(name, spec)
            except SpecMismatch as exc:
                out.refused.append((name, exc.reason))
                continue
            out.streams.append(name)  # type: ignore[union-attr]
        return out

    def stream_specs(self) -> dict[str, dict[str, Any]]:
        """``{stream: StreamSpec}`` (JSON-ready) a round must send to get this device's configured reports."""
        return {name: plan.stream_spec() for name, plan in self.streams.items()}

    def prepare(
        self, record: Record, streams: list[str] | None = None, plans: Mapping[str, StreamPlan] | None = None,
        now: float = 0.0,
    ) -> list[PreparedReport]:
        """One :class:`PreparedReport` per stream (all streams, or the named ones in configuration order);
        ``plans`` replaces the configured plan of some streams for this round (see :meth:`round_plans`)."""
        names = list(self.streams) if streams is None else [s for s in self.streams if s in set(streams)]
        out = []
        for name in names:
            plan = (plans or {}).get(name) or self.streams[name]
            if plan.change_bounded:
                out.append(self._tree_report(plan, record, now))
                continue
            if plan.longitudinal:
                key, make_body = self._longitudinal_report(plan, record)
                refresh = True
            else:
                canon, t = self._view(plan, record)
                key = memo_key(self._secret, name, plan.spec, canon)
                make_body = self._body_maker(plan, self._mechanism_input(plan, record, t))
                refresh = False
            out.append(
                PreparedReport(
                    stream=name,
                    mechanism=plan.mechanism_name,
                    spec=plan.spec,
                    memo_key=key,
                    epsilon=plan.charge,
                    cap=plan.cap,
                    memoize=plan.memoize,
                    make_body=make_body,
                    refresh=refresh,
                    delta=plan.delta,
                    unit=plan.unit,
                )
            )
        return out

    def _tree_report(self, plan: StreamPlan, record: Record, now: float) -> PreparedReport:
        """A ``ddrm`` stream's report: the next step of its tree (a new tree when the last one is complete or older
        than the renewal period). The step's charge (``step_charge``, data-independent) covers the releases up to
        the tree's end (``until`` = tree start + renewal period), so any sliding budget window that sees part of a
        tree counts every charge of it up to then; the new tree state commits with the report or not at all."""
        from protocols.longitudinal.base import client_from_state

        mech = plan.mechanism
        period = self.config.ledger.renewal_period_s
        key = f"stream:{plan.name}"
        saved = self._trees.get(plan.name)
        fresh = (saved is None or saved["spec"] != plan.spec or saved["client"]["device"]["t"] >= mech.horizon
                 or (period is not None and now >= saved["start"] + period))
        if fresh:
            client = mech.client(secret=self._secret, stream=plan.name, rng=self.rng)
            start = now
        else:
            client = client_from_state(saved["client"], rng=self.rng)  # type: ignore[index]
            start = saved["start"]  # type: ignore[index]
        rep = client.report(int(record.values[plan.dimensions[0].name]))
        state = {"spec": plan.spec, "start": start, "client": client.to_state()}
        body = {"report": registry.row_to_json(np.asarray(rep.report))}

        def committed() -> None:
            self._trees[plan.name] = state

        return PreparedReport(
            stream=plan.name, mechanism=plan.mechanism_name, spec=plan.spec, memo_key=f"tree:{start!r}",
            epsilon=float(rep.charge), cap=plan.cap, memoize=False, make_body=lambda: body, delta=0.0,
            unit=plan.unit, until=None if period is None else start + period, state=(key, state),
            on_commit=committed)

    # --- persistence --------------------------------------------------------------------------------------

    @property
    def rounding_dirty(self) -> bool:
        return any(r.dirty for r in self._rounding.values())

    def rounding_saved(self) -> None:
        """The state last returned by ``rounding_state(clear_dirty=False)`` is durable: clear the dirty flags."""
        for r in self._rounding.values():
            r.dirty = False

    def rounding_state(self, clear_dirty: bool = True) -> dict[str, dict[str, Any]]:
        """Per-dimension α offsets, current epoch plan and reading index (no raw values) for the state DB."""
        states = {name: r.to_state() for name, r in self._rounding.items()}
        if clear_dirty:
            for r in self._rounding.values():
                r.dirty = False
        return states

    def volatility_scores(self) -> dict[str, float]:
        return {name: float(r.detector.scores[0]) for name, r in self._rounding.items()}
