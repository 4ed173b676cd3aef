"""The device side of the round contract: whether, and how, a device follows a round's stream spec.

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

Refusal reasons are :class:`protocols.errors.SpecMismatchReason`; docs/agent.md has the table.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from protocols import wire
from protocols.base import FrequencyOracle, NumericMechanism
from protocols.contract import StreamSpec
from protocols.errors import SpecMismatch

from .config import DimensionConfig
from .plans import StreamPlan, _mechanism_delta

__all__ = ["RoundPlans", "plan_for_spec", "spec_text"]


_SPEC_TEXTS: "OrderedDict[int, tuple[StreamSpec, str]]" = OrderedDict()


def spec_text(spec: StreamSpec) -> str:
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
                "scalar": ("distribution",) if base.distribution else ("numeric", "vector", "haar"),
                "vector": ("vector", "haar")}[base.kind]
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
    if spec.kind == "distribution":
        from protocols.distribution import DistributionMechanism

        if not isinstance(mech, DistributionMechanism):
            raise SpecMismatch("mechanism", f"stream {name!r}: {mech_name!r} is not a distribution mechanism")
    elif spec.kind == "frequency" and not isinstance(mech, FrequencyOracle):
        raise SpecMismatch("mechanism", f"stream {name!r} is categorical; {mech_name!r} is not a frequency oracle")
    elif base.kind != "categorical" and not isinstance(mech, NumericMechanism):
        raise SpecMismatch("mechanism", f"stream {name!r} is numeric; {mech_name!r} is not a numeric mechanism")
    if spec.kind == "distribution":
        pass  # one value on the grid of the round's D over the device's own bounds (checked above)
    elif base.kind == "categorical":
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
