"""Stream plans: how each configured stream is reported — its mechanism, canonical spec, charge and privacy unit.

**Longitudinal streams** (``epsilon_1``/``epsilon_inf`` with mechanism ``lgrr`` or ``loloha``, one categorical
dimension) run the :mod:`protocols.longitudinal` client: the memo key is the *protocol's* memo key of the value's
memo slot (the value; LOLOHA's hashed value), keyed by the device HMAC secret; the permanent randomized response is
derived from the same secret (stateless PRR, RAPPOR's pattern), a new key is charged ε∞ and every report — memo hit
or not — is a *fresh* instantaneous randomized response (ε1 per report). LOLOHA's hash seed is derived from the
secret (:func:`protocols.memo_key.device_seed`), so it is fixed for the device's life.

**Distribution streams** (SPEC §3.14): one numeric dimension with ``mechanism`` a distribution catalogue name
(``distribution_flat``, ``distribution_hierarchical``, ``distribution_haar``, ``distribution_square_wave``) or
``distribution_auto`` (:func:`protocols.distribution.choose_distribution_mechanism`: the least analytic variance for
``params.query``, default ``cdf``); ``params.D`` is the number of buckets of the public grid over the dimension's
bounds (a power of two, default 64). The clipped value is bucketised on the grid (Square Wave: scaled to [0, 1]) and
privatized; under the value unit the memo key is the bucket (Square Wave: the value), so a memo entry is charged ε
once per bucket; under the device unit every report is charged ε.

**Mechanism policy** ``auto`` delegates to :func:`protocols.pipeline.choose_mechanism` (the one chooser of the
project: lowest analytic variance, exact variance models): categorical → GRR / OUE / OLH; a numeric stream of d
dimensions → HM k-sampling, Duchi multi-dim or the Haar record mechanism for the stream's query (``params = {"query":
"mean" | "range" | "dyadic" | "total"}``, default ``mean``); the stream runs the choice's
:meth:`~protocols.pipeline.MechanismChoice.deployed` mechanism (for d = 1 a k-sampling winner is HM itself, named
``hybrid``).

:func:`build_stream_plan` resolves a configured stream into a :class:`StreamPlan`; :attr:`StreamPlan.charge` is
what the ledger charges per report (the formulas of :mod:`protocols.accounting`); :func:`privacy_statement` says
what that number bounds.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from protocols import catalogue, wire
from protocols.accounting import check_delta_cap, report_charge
from protocols.catalogue import Family, Role
from protocols.contract import AUTO, DISTRIBUTION_AUTO, HeavyHitterSpec, StreamSpec
from protocols.errors import BudgetExceededError, ConfigError

from .config import AgentConfig, DimensionConfig, StreamConfig

__all__ = ["StreamPlan", "privacy_statement", "choose_mechanism", "build_stream_plan", "stream_specs",
           "DISTRIBUTION_AUTO", "DEFAULT_BUCKETS"]

#: Buckets of a distribution stream's grid when ``params.D`` is not given.
DEFAULT_BUCKETS = 64





@dataclass(frozen=True)
class StreamPlan:
    """A stream resolved against the registry: its mechanism object, canonical spec and budget. Immutable: what is
    derived from its fields (``charge``, the catalogue's family and roles) is computed once per plan."""

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

    @functools.cached_property
    def charge(self) -> float:
        """ε the ledger charges for one report of this plan under its privacy unit (value unit: per new memo entry):
        :func:`protocols.accounting.report_charge`."""
        return report_charge(self.mechanism_name, self.mechanism, self.epsilon, self.unit)

    @functools.cached_property
    def change_bounded(self) -> bool:
        """A DDRM stream: cost grows with the value's changes (up to a declared budget), not with the reports."""
        return Role.CHANGE_BOUNDED in catalogue.entry(self.mechanism_name).roles

    @functools.cached_property
    def kind(self) -> str:
        """The stream's shape: ``categorical``, ``scalar`` (one numeric dimension) or ``vector``."""
        if self.dimensions[0].kind == "categorical":
            return "categorical"
        return "vector" if len(self.dimensions) > 1 else "scalar"

    @functools.cached_property
    def longitudinal(self) -> bool:
        return catalogue.entry(self.mechanism_name).family is Family.LONGITUDINAL

    @functools.cached_property
    def distribution(self) -> bool:
        """A distribution stream (SPEC §3.14): one numeric value on a public bucket grid."""
        return catalogue.entry(self.mechanism_name).family is Family.DISTRIBUTION

    def grid(self) -> Any:
        """A distribution plan's public :class:`~protocols.distribution.BucketGrid` (its dimension's bounds, D)."""
        from protocols.distribution.grid import BucketGrid

        d = self.dimensions[0]
        return BucketGrid(float(d.lo), float(d.hi), int(self.mechanism.D))  # type: ignore[arg-type]

    @property
    def spec_kind(self) -> str:
        """The coordinator's :class:`~protocols.contract.StreamSpec` kind of this plan."""
        if self.distribution:
            return "distribution"
        if self.longitudinal:
            return "longitudinal"
        if self.kind == "categorical":
            return "frequency"
        family = catalogue.entry(self.mechanism_name).family
        if family is Family.HAAR:
            return "haar"
        return "numeric" if self.kind == "scalar" and (family is not Family.VECTOR or self.mechanism.d == 1) \
            else "vector"

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



@functools.lru_cache(maxsize=128)
def _init_parameters(cls: type) -> frozenset[str]:
    """Names of a mechanism class's constructor parameters (cached: inspecting a signature is slow next to a
    dictionary lookup, and plans are built per round)."""
    return frozenset(inspect.signature(cls.__init__).parameters)


def _constructor_params(name: str, stream: StreamConfig, dims: tuple[DimensionConfig, ...], epsilon: float) -> dict[str, Any]:
    accepted = _init_parameters(catalogue.mechanism_class(name))
    params: dict[str, Any] = {"epsilon": epsilon}
    if dims[0].kind == "categorical":
        if "k" in accepted:
            params["k"] = dims[0].domain_size
    elif "d" in accepted:
        params["d"] = len(dims)
    params.update(stream.params)
    return params


def _resolved(name: str, params: dict[str, Any], mech: Any) -> dict[str, Any]:
    """Constructor parameters with every automatic choice resolved (the mechanisms the catalogue marks
    ``resolves_params``: HaarRecord's mean mechanism and split, Hadamard response's design ``rows``), so the
    coordinator rebuilds exactly the device's mechanism from the stream spec, whatever version of the automatic rule
    either side runs."""
    return dict(mech._params()) if catalogue.entry(name).resolves_params else params


@functools.lru_cache(maxsize=256)
def _auto_choice(epsilon: float, d: int, query: str, k: int | None) -> tuple[str, str, Any]:
    """``protocols.pipeline.choose_mechanism`` (cached: it is analytic, and agents of a fleet share the answer)."""
    from protocols.pipeline import choose_mechanism as choose

    name, params, mech = choose(epsilon, d, query, k).deployed()
    return name, wire.canonical_json(params).decode(), mech


@functools.lru_cache(maxsize=64)
def _distribution_auto_choice(epsilon: float, D: int, query: str, length: Any) -> Any:
    """``protocols.distribution.choose_distribution_mechanism``'s mechanism (cached like :func:`_auto_choice`: it
    ranks every candidate mechanism and branching by its analytic variance, O(candidates·D) work, and agents of a
    fleet share the answer; the mechanisms hold no state after construction)."""
    from protocols.distribution import choose_distribution_mechanism

    return choose_distribution_mechanism(epsilon, D, query, length).mechanism


def _longitudinal_protocol(stream: StreamConfig, dims: tuple[DimensionConfig, ...]) -> tuple[str, dict[str, Any], Any]:
    name = stream.mechanism
    allowed = catalogue.names(Role.STREAM, Family.LONGITUDINAL)
    if name not in allowed:
        raise ConfigError(
            f"stream {stream.name!r}: longitudinal streams need an explicit mechanism name, one of "
            f"{', '.join(allowed)} (got {name!r})"
        )
    if dims[0].kind != "categorical" or len(dims) != 1:
        raise ConfigError(f"stream {stream.name!r}: a longitudinal stream has one categorical dimension")
    params = {"epsilon_inf": stream.epsilon_inf, "epsilon_1": stream.epsilon_1, "k": dims[0].domain_size,
              **stream.params}
    try:
        proto = catalogue.entry(name).cls(**params)
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


def _distribution_mechanism(stream: StreamConfig, dims: tuple[DimensionConfig, ...],
                            epsilon: float) -> tuple[str, dict[str, Any], Any]:
    """A distribution stream's mechanism (module docstring): by name, or ``distribution_auto``."""
    if len(dims) != 1 or dims[0].kind != "numeric":
        raise ConfigError(f"stream {stream.name!r}: a distribution stream has exactly one numeric dimension")
    D = stream.params.get("D", DEFAULT_BUCKETS)
    if isinstance(D, bool) or not isinstance(D, int) or not 2 <= D <= 1 << 14 or D & (D - 1):
        raise ConfigError(f"stream {stream.name!r}: params.D (buckets) must be a power of two in [2, 16384], got {D!r}")
    if stream.mechanism == DISTRIBUTION_AUTO:
        extra = set(stream.params) - {"D", "query", "length"}
        if extra:
            raise ConfigError(f"stream {stream.name!r}: {DISTRIBUTION_AUTO} takes only params.D, params.query and "
                              f"params.length, got {sorted(extra)}")
        try:
            mech = _distribution_auto_choice(float(epsilon), D, str(stream.params.get("query", "cdf")),
                                             stream.params.get("length"))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"stream {stream.name!r}: {DISTRIBUTION_AUTO}: {exc}") from None
        return catalogue.distribution_entry(mech).name, dict(mech._params()), mech
    name = stream.mechanism
    params = {"epsilon": float(epsilon), **stream.params, "D": D}
    try:
        mech = catalogue.build(name, **params)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"stream {stream.name!r}: mechanism {name!r}: {exc}") from None
    return name, dict(mech._params()), mech


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
    if stream.mechanism in catalogue.names(Role.CHANGE_BOUNDED):
        return _change_bounded_protocol(stream, dims, epsilon)
    if stream.mechanism in catalogue.names(Role.STREAM, Family.LONGITUDINAL):
        raise ConfigError(f"stream {stream.name!r}: mechanism {stream.mechanism!r} needs epsilon_1 and epsilon_inf")
    if stream.mechanism == DISTRIBUTION_AUTO or stream.mechanism in catalogue.names(Role.STREAM, Family.DISTRIBUTION):
        return _distribution_mechanism(stream, dims, epsilon)
    if stream.mechanism != AUTO:
        name = stream.mechanism
        try:
            params = _constructor_params(name, stream, dims, epsilon)
            mech = catalogue.build(name, **params)
        except (ValueError, ImportError, AttributeError) as exc:
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r}: {exc}") from None
        family = catalogue.entry(name).family
        if kind == "vector" and (family not in (Family.VECTOR, Family.HAAR) or mech.d != len(dims)):
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} does not take {len(dims)}-vectors")
        if kind == "categorical" and family is not Family.FREQUENCY:
            raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} is not a frequency oracle")
        return name, _resolved(name, params, mech), mech
    extra = set(stream.params) - {"query"}
    if extra:
        raise ConfigError(f"stream {stream.name!r}: mechanism {AUTO!r} takes only params.query, got {sorted(extra)}")
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
    cap = cfg.ledger.delta_cap
    try:  # the ledger's δ rule, checked once at configuration for one report
        check_delta_cap(0.0, delta, cap)
    except BudgetExceededError:
        raise ConfigError(f"stream {stream.name!r}: mechanism {name!r} has δ = {delta:g}; set ledger.delta_cap "
                              f"(the most Σδ the device spends) to at least that (now {cap})") from None
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
            epsilon if name in catalogue.names(Role.CHANGE_BOUNDED) else None),
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
