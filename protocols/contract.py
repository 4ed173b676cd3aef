"""The round contract: the round-parameter and report-body conventions the coordinator and the edge agent share.

It lives in :mod:`protocols` (the one package both sides import; the device never imports the coordinator) and
depends only on pydantic, numpy and :mod:`protocols.wire` (see docs/coordinator.md).

**Round parameters.** ``RoundConfig.params`` (:mod:`protocols.wire`) is a :class:`RoundParams`::

    {"streams": {"<stream>": {"kind": "numeric" | "vector" | "frequency" | "haar" | "longitudinal" | "distribution",
                              "mechanism": "<name>", "params": {...},                # StreamSpec.build() makes it
                              "dims": ["cpu", ...], "bounds": [[lo, hi], ...],       # numeric/vector/haar
                              "rounding": [step or null per dim] | null,              # α-rounding steps (units of x),
                                                                                      # nested: (hi-lo)/K_base·2^m
                              "heavy_hitters": {...} | null}}}                        # prefix extension (frequency)

**Report body.** A device's :class:`protocols.wire.Report` for stream ``s`` of round ``r`` carries
``mechanism = StreamSpec.wire_mechanism`` and ``body = {"report": ROW}`` where ROW is
``protocols.catalogue.entry(mechanism).encode_row`` of one row of the mechanism's ``privatize`` output (a scalar
or a list). For ``kind == "haar"`` ROW is ``{"mean": y, "detail": [z_1 … z_{D-1}]}``; for
``kind == "longitudinal"`` it is the protocol client's report (L-GRR: the reported symbol; LOLOHA: ``[seed, y]``).
The coordinator decodes with the same catalogue entry (``StreamSpec.entry``).

**Bounds are the device's.** A device refuses a stream of a round whose ``dims`` or ``bounds`` differ from the
dimensions it declares (it never adopts a round's bounds: its clipping, α-rounding state and memo keys are tied to
its own); a round built from the devices' declarations (``edge_agent.Agent.stream_specs()``) agrees by
construction. ``rounding`` and the mechanism (within the device's ε; an (ε, δ) mechanism only if the device's own
stream uses it with at least that small a δ) are public round parameters it does follow — for a dimension the
device α-rounds, only its nested grid steps ``(hi − lo)/K_base·2^m`` (m ≥ 0, at most hi − lo; ``null`` = exact is
refused), so a round cannot multiply a device's memo entries. ``labels`` must be the device's categories.
Reports outside the stream mechanism's support are rejected at ingest (:mod:`coordinator.decode`).

**Normalisation.** Numeric values are clipped to ``[lo, hi]`` and normalised ``t = 2(x - lo)/(hi - lo) - 1``
before privatizing (:func:`normalise`); the coordinator de-normalises ``x = lo + (t + 1)(hi - lo)/2``.

**Haar records** (SPEC §2.4). ``mechanism = "haar"``, ``params`` = the constructor arguments of
:class:`protocols.pipeline.HaarRecord` (``epsilon``, ``d`` = number of dims, ``mean_mechanism``,
``detail_mechanism``, ``split``): the d normalised values are zero-padded to D = 2^⌈log2 d⌉, transformed, the mean
goes through the mean mechanism with ε_m = split·ε and the D-1 details through the detail mechanism with
ε_c = ε - ε_m. The older form with explicit ``mean`` and ``detail`` mechanism specs is still accepted and converted
(:func:`haar_params_from_components`).

**Longitudinal streams** (SPEC §3.9–3.10). ``mechanism`` is a longitudinal catalogue name (``lgrr``,
``loloha``, ``ddrm``), ``params`` the protocol's constructor arguments (``epsilon_inf``, ``epsilon_1``, ``k`` [, ``g``]);
one categorical dimension. A report costs at most ε∞ (a new memo slot), which is what :attr:`StreamSpec.epsilon`
counts towards the round's ε.

**Distribution streams** (SPEC §3.14). ``mechanism`` is a distribution catalogue name (``distribution_flat``,
``distribution_hierarchical``, ``distribution_haar``, ``distribution_square_wave``), ``params`` its constructor
arguments (``epsilon``, ``D`` = the number of buckets, a power of two in [2, 2^14], and e.g. ``oracle``,
``branching``); exactly one numeric dimension with bounds, no rounding (the public bucket grid
:meth:`StreamSpec.grid` is the coarsening). The device clips the value to the bounds, bucketises it on the grid
(Square Wave: scales it to [0, 1]) and reports one row of the mechanism; the coordinator estimates the histogram,
the CDF and quantiles with intervals (:class:`protocols.distribution.DistributionEstimate`).

**Privacy unit.** ``unit`` (``device``, the default, or ``value``) names what the devices' ledgers bound for this
stream: ``device`` — everything a device released in its budget window against any other readings (fresh
randomization per report, nothing memoized); ``value`` — the loss about each distinct value (memoized reports, which
do not hide when a value changes). A device answers a stream only under its own configured unit; estimates carry
the unit in their metadata.

**Heavy hitters** (sequentially interactive prefix extension, SPEC §3.13/§5): see :class:`HeavyHitterSpec` and
:func:`heavy_hitter_items`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from protocols import catalogue
from protocols.base import check_bounds
from protocols.wire import IDENT

__all__ = [
    "BODY_KEY",
    "HAAR_MECHANISM",
    "AUTO",
    "DISTRIBUTION_AUTO",
    "haar_params_from_components",
    "StreamKind",
    "MechanismSpec",
    "HeavyHitterSpec",
    "StreamSpec",
    "RoundParams",
    "parse_round_params",
    "make_body",
    "body_row",
    "body_row_of",
    "Bounds",
    "clip",
    "normalise",
    "denormalise",
    "heavy_hitter_items",
]

#: ``Report.body == {BODY_KEY: row}``.
BODY_KEY = "report"
#: ``Report.mechanism`` of a Haar-record stream.
HAAR_MECHANISM = "haar"
#: A device's configured mechanism meaning "the lower-variance mechanism" (protocols.pipeline.choose_mechanism,
#: edge_agent.plans); in an enrolment contract it admits whatever mechanism a round names (:meth:`StreamSpec.admits`).
AUTO = "auto"
#: A device's configured mechanism meaning "the least-variance distribution mechanism" (edge_agent.plans); in an
#: enrolment contract it admits any distribution mechanism a round names (:meth:`StreamSpec.admits`).
DISTRIBUTION_AUTO = "distribution_auto"


StreamKind = Literal["numeric", "vector", "frequency", "haar", "longitudinal", "distribution"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MechanismSpec(_Model):
    """A mechanism by catalogue name (:mod:`protocols.catalogue`) and its constructor parameters."""

    mechanism: str = Field(pattern=IDENT)
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def epsilon(self) -> float:
        return float(self.params.get("epsilon", 0.0))


class HeavyHitterSpec(_Model):
    """One round of prefix extension over values of ``bits`` bits (SPEC §3.13, §5).

    The round asks about items ``(candidate prefix, next step_bits bits)``: a value ``x`` whose top
    ``prefix_bits`` bits equal ``candidates[i]`` maps to item ``i·2^step_bits + next_bits(x)``; any other value maps
    to the catch-all item ``len(candidates)·2^step_bits``. The stream's frequency oracle therefore has
    ``k = len(candidates)·2^step_bits + 1``. The first round has ``prefix_bits = 0`` and ``candidates = [0]``.

    How the coordinator selects this round's heavy items (its estimate's ``heavy_hitters`` and the next round's
    candidates, :func:`coordinator.estimate.select_heavy_hitters`) — optional, omitted from the JSON when unset, so
    rounds without them read and serialise as before; devices ignore both:

    * ``threshold`` — a frequency in [0, 1]: keep the items whose estimated frequency reaches it. Unset: the items
      significantly above zero (estimate > z·stderr, z = 3 by default: a prefix nobody holds passes with probability
      ≤ Φ(−3) ≈ 0.00135, normal approximation).
    * ``top_k`` — keep at most the k best of the items passing the threshold (which stays a floor), as
      :mod:`protocols.heavy_hitters` does at each extension step. Unset: at most the planner's ``max_candidates``.
    """

    bits: int = Field(ge=1, le=62)
    prefix_bits: int = Field(ge=0)
    step_bits: int = Field(ge=1, le=16)
    candidates: list[int] = Field(min_length=1)
    threshold: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=1)

    @field_validator("threshold", "top_k", mode="before")
    @classmethod
    def _no_coercion(cls, v: Any, info: Any) -> Any:
        """No booleans, and top_k no float: ``True`` or ``3.0`` is a mistake, not a count."""
        kinds = (int,) if info.field_name == "top_k" else (int, float)
        if v is not None and (isinstance(v, bool) or not isinstance(v, kinds)):
            what = "an integer >= 1" if info.field_name == "top_k" else "a frequency in [0, 1]"
            raise ValueError(f"{info.field_name} must be {what}")
        return v

    @model_serializer(mode="wrap")
    def _omit_unset_selection(self, handler: Any) -> dict[str, Any]:
        """Rounds without a threshold or top-k serialise exactly as before these fields existed."""
        data = handler(self)
        for key in ("threshold", "top_k"):
            if data.get(key, 0) is None:
                del data[key]
        return data

    @model_validator(mode="after")
    def _check(self) -> "HeavyHitterSpec":
        if self.prefix_bits + self.step_bits > self.bits:
            raise ValueError("prefix_bits + step_bits must not exceed bits")
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError("candidates must be distinct")
        if any(c < 0 or c >= (1 << self.prefix_bits) for c in self.candidates):
            raise ValueError(f"candidates must be prefixes of {self.prefix_bits} bits")
        return self

    @property
    def k(self) -> int:
        return len(self.candidates) * (1 << self.step_bits) + 1

    def prefix_name(self, prefix: int, width: int, names: list[str] | None) -> str:
        """How to show a ``width``-bit prefix: its bits; with the stream's category ``names``, the category it has
        narrowed down to, or the first it still covers and how many more (``"United-States +15"``)."""
        if names is None:
            return format(prefix, f"0{width}b")
        shift = self.bits - width
        covered = names[prefix << shift: (prefix + 1) << shift]
        if not covered:
            return f"(none: {prefix:0{width}b})"
        return covered[0] if len(covered) == 1 else f"{covered[0]} +{len(covered) - 1}"

    @property
    def prefixes(self) -> list[int]:
        """The (prefix_bits + step_bits)-bit prefix each item but the catch-all stands for, in item order:
        :func:`protocols.heavy_hitters.extend_prefixes` of the candidates (the one encoding)."""
        from protocols.heavy_hitters import extend_prefixes  # numpy only; keep the contract's import light

        return extend_prefixes(self.candidates, self.step_bits).tolist()

    def item_prefix(self, item: int) -> int | None:
        """The (prefix_bits + step_bits)-bit prefix an item stands for; None for the catch-all item."""
        if item == self.k - 1:
            return None
        return self.prefixes[int(item)]


def haar_params_from_components(mean: MechanismSpec, detail: MechanismSpec, d: int) -> dict[str, Any]:
    """The ``HaarRecord`` parameters equivalent to the component form ``{"mean": …, "detail": …}``.

    ε = ε_m + ε_c and ``split = ε_m/ε``; the mean mechanism must be one of PDP/PM/HM/Duchi with only ``epsilon``,
    the detail mechanism k-sampling (HM base) or Duchi multi-dim over ``d = D - 1`` coordinates.
    """
    from protocols.haar import padded_size  # numpy only; keep the contract's import light

    means, details = catalogue.names(catalogue.Role.HAAR_MEAN), catalogue.names(catalogue.Role.HAAR_DETAIL)
    if mean.mechanism not in means or set(mean.params) != {"epsilon"}:
        raise ValueError(f"a haar mean mechanism is one of {means} with only 'epsilon'")
    extra = set(detail.params) - {"epsilon", "d", "base"}
    if detail.mechanism not in details or extra or detail.params.get("base", "hybrid") != "hybrid":
        raise ValueError(f"a haar detail mechanism is one of {details} (k-sampling with the hybrid base)")
    if int(detail.params.get("d", -1)) != padded_size(d) - 1:
        raise ValueError(f"the haar detail mechanism of {d} dims has d = {padded_size(d) - 1}")
    eps_m, eps_c = mean.epsilon, detail.epsilon
    if not (eps_m > 0 and eps_c > 0):
        raise ValueError("haar mean and detail mechanisms need epsilon > 0")
    return {"epsilon": eps_m + eps_c, "d": int(d), "mean_mechanism": mean.mechanism,
            "detail_mechanism": detail.mechanism, "split": eps_m / (eps_m + eps_c)}


class StreamSpec(_Model):
    """How one stream is collected in a round (see the module docstring)."""

    kind: StreamKind
    mechanism: str | None = Field(default=None, pattern=IDENT)
    params: dict[str, Any] = Field(default_factory=dict)
    dims: list[str] = Field(min_length=1)
    bounds: list[tuple[float, float]] | None = None
    labels: list[str] | None = None
    units: list[str] | None = Field(
        default=None, description="display only: each numeric dimension's unit of measurement ('' when unnamed)")
    mean: MechanismSpec | None = Field(default=None, description="input only: converted to mechanism 'haar'")
    detail: MechanismSpec | None = Field(default=None, description="input only: converted to mechanism 'haar'")
    rounding: list[float | None] | None = None
    heavy_hitters: HeavyHitterSpec | None = None
    unit: Literal["device", "value"] = Field(
        "device", description="the privacy unit the devices' ledgers charge this stream under (edge_agent.config)")

    @model_validator(mode="before")
    @classmethod
    def _haar_form(cls, data: Any) -> Any:
        """Convert the component form of a haar stream to ``mechanism = "haar"`` + HaarRecord params."""
        if not isinstance(data, dict) or data.get("kind") != "haar":
            return data
        data = dict(data)
        dims = data.get("dims")
        d = len(dims) if isinstance(dims, list) else None
        if data.get("mean") is not None or data.get("detail") is not None:
            if data.get("mean") is None or data.get("detail") is None:
                raise ValueError("the component form of a haar stream needs both 'mean' and 'detail'")
            if data.get("params"):
                raise ValueError("a haar stream gives either params or mean/detail, not both")
            if d is None:
                raise ValueError("a haar stream needs dims")
            data["params"] = haar_params_from_components(MechanismSpec.model_validate(data.pop("mean")),
                                                         MechanismSpec.model_validate(data.pop("detail")), d)
        data.pop("mean", None)
        data.pop("detail", None)
        if data.get("mechanism") is None:
            data["mechanism"] = HAAR_MECHANISM
        if isinstance(data.get("params"), dict) and d is not None and "d" not in data["params"]:
            data["params"] = {**data["params"], "d": d}
        return data

    @model_validator(mode="after")
    def _check(self) -> "StreamSpec":
        if self.kind == "haar":
            if self.mechanism != HAAR_MECHANISM:
                raise ValueError(f"a haar stream's mechanism is {HAAR_MECHANISM!r}")
            if self.params.get("d") != len(self.dims):
                raise ValueError(f"a haar stream over {len(self.dims)} dims has d = {len(self.dims)}")
        elif self.mean is not None or self.detail is not None:
            raise ValueError("'mean'/'detail' belong to haar streams")
        elif self.mechanism is None:
            raise ValueError(f"a {self.kind} stream needs a 'mechanism'")
        if self.kind == "longitudinal":
            allowed = catalogue.names(catalogue.Role.STREAM, catalogue.Family.LONGITUDINAL)
            if self.mechanism not in allowed:
                raise ValueError(f"longitudinal mechanisms: {', '.join(allowed)}")
            if len(self.dims) != 1:
                raise ValueError("a longitudinal stream has exactly one (categorical) dimension")
            if "epsilon_inf" not in self.params or "k" not in self.params:
                raise ValueError("a longitudinal stream states epsilon_inf, epsilon_1 and k")
        if self.kind == "distribution":
            allowed = catalogue.names(catalogue.Role.STREAM, catalogue.Family.DISTRIBUTION)
            if self.mechanism not in allowed:
                raise ValueError(f"distribution mechanisms: {', '.join(allowed)}")
            if len(self.dims) != 1:
                raise ValueError("a distribution stream has exactly one numeric dimension")
            D = self.params.get("D")
            if isinstance(D, bool) or not isinstance(D, int) or not 2 <= D <= 1 << 14 or D & (D - 1):
                raise ValueError(f"a distribution stream's params.D (buckets) is a power of two in [2, 16384], got {D!r}")
            if self.labels is not None:
                raise ValueError("a distribution stream has no labels (its buckets are the grid's)")
            if self.rounding is not None:
                raise ValueError("a distribution stream is not α-rounded (its bucket grid is the coarsening)")
        if self.kind in ("numeric", "vector", "haar", "distribution"):
            if self.bounds is None or len(self.bounds) != len(self.dims):
                raise ValueError("numeric streams need one [lo, hi] bound per dimension")
            for lo, hi in self.bounds:
                try:
                    check_bounds(lo, hi)
                except ValueError:
                    raise ValueError(f"bounds must be finite with lo < hi, got [{lo}, {hi}]") from None
        elif self.bounds is not None:
            raise ValueError(f"a {self.kind} stream has no bounds")
        if self.units is not None and (self.bounds is None or len(self.units) != len(self.dims)
                                       or any(len(u) > 32 for u in self.units)):
            raise ValueError("units name one unit (≤ 32 characters) per dimension of a numeric stream")
        if self.kind == "numeric" and len(self.dims) != 1:
            raise ValueError("a numeric stream has exactly one dimension (use 'vector' or 'haar')")
        if self.kind == "frequency" and len(self.dims) != 1:
            raise ValueError("a frequency stream has exactly one dimension")
        if self.rounding is not None:
            if self.kind not in ("numeric", "vector", "haar"):
                raise ValueError("rounding applies to numeric dimensions only")
            if len(self.rounding) != len(self.dims):
                raise ValueError("rounding needs one step (or null) per dimension")
            if any(s is not None and not (math.isfinite(s) and s > 0) for s in self.rounding):
                raise ValueError("rounding steps must be positive")
        if self.heavy_hitters is not None:
            if self.kind != "frequency":
                raise ValueError("heavy_hitters needs a frequency stream")
            if int(self.params.get("k", -1)) != self.heavy_hitters.k:
                raise ValueError(f"the oracle's k must be {self.heavy_hitters.k} for these candidates")
        return self

    @property
    def wire_mechanism(self) -> str:
        """The ``Report.mechanism`` devices send for this stream."""
        return HAAR_MECHANISM if self.kind == "haar" else str(self.mechanism)

    def admits(self, enrolled: str) -> bool:
        """Whether a device whose enrolment contract lists this stream with mechanism ``enrolled`` may answer it:
        ``auto`` admits whatever the round names, ``distribution_auto`` any mechanism of a distribution stream (the
        device's round contract follows the round's distribution mechanism — edge_agent.round_contract), any other
        name only itself."""
        if enrolled == AUTO:
            return True
        if enrolled == DISTRIBUTION_AUTO:
            return self.kind == "distribution"
        return enrolled in (self.wire_mechanism, str(self.mechanism))

    @property
    def epsilon(self) -> float:
        """ε one report of this stream spends at most (ε∞ — a new memo slot — for longitudinal streams)."""
        key = "epsilon_inf" if self.kind == "longitudinal" else "epsilon"
        return float(self.params.get(key, 0.0))

    @property
    def entry(self) -> catalogue.Entry:
        """The stream mechanism's catalogue entry."""
        return catalogue.entry(self.wire_mechanism)

    def build(self) -> Any:
        """The mechanism object both sides use: ``protocols.catalogue.build(mechanism, **params)`` (HaarRecord for
        haar streams, the :mod:`protocols.longitudinal` protocol for longitudinal ones). ValueError on bad
        parameters."""
        return self.entry.build(**self.params)

    def grid(self) -> Any:
        """A distribution stream's public :class:`~protocols.distribution.BucketGrid` (bounds, ``params.D``)."""
        if self.kind != "distribution" or self.bounds is None:
            raise ValueError("only a distribution stream has a bucket grid")
        from protocols.distribution.grid import BucketGrid  # numpy only; keep the contract's import light

        lo, hi = self.bounds[0]
        return BucketGrid(lo, hi, int(self.params["D"]))

    def lo_hi(self) -> tuple[np.ndarray, np.ndarray]:
        if self.bounds is None:
            raise ValueError("stream has no bounds")
        b = np.asarray(self.bounds, dtype=float)
        return b[:, 0], b[:, 1]


class RoundParams(_Model):
    """``RoundConfig.params`` of a data-collection round."""

    streams: dict[str, StreamSpec] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _names_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("streams"), list):
            raise ValueError("streams must map each stream name to its StreamSpec, not list names (the spec is what "
                             "the coordinator estimates from; `haarvest agent check-config` prints a device's as "
                             "round_params)")
        return data

    @model_validator(mode="after")
    def _check(self) -> "RoundParams":
        import re

        for name in self.streams:
            if not re.match(IDENT, name):
                raise ValueError(f"stream name {name!r} is not a valid identifier")
        return self

    @property
    def epsilon(self) -> float:
        """Total ε a device spends answering every stream once (sequential composition)."""
        return sum(s.epsilon for s in self.streams.values())


def parse_round_params(params: dict[str, Any] | RoundParams) -> RoundParams:
    """Validate ``RoundConfig.params``; ValueError (pydantic's) on anything malformed."""
    return params if isinstance(params, RoundParams) else RoundParams.model_validate(params)


def make_body(row: Any) -> dict[str, Any]:
    """The report body for one privatized row (a device uses this)."""
    return {BODY_KEY: row}


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -(2**63) <= v < 2**63
    return isinstance(v, float) and math.isfinite(v)


def _check_row(row: Any, length: int | None) -> None:
    if _is_number(row):
        if length not in (None, 1):
            raise ValueError(f"expected a list of {length} numbers")
        return
    if not isinstance(row, list) or not row or not all(_is_number(v) for v in row):
        raise ValueError("a report row must be a finite number or a non-empty list of finite numbers")
    if length is not None and len(row) != length:
        raise ValueError(f"expected {length} numbers, got {len(row)}")


def body_row_of(body: Any) -> Any:
    """The row of a report body ``{BODY_KEY: row}`` (:func:`make_body`'s inverse; ValueError for any other shape)."""
    if not isinstance(body, dict) or set(body) != {BODY_KEY}:
        raise ValueError(f"body must be {{{BODY_KEY!r}: row}}")
    return body[BODY_KEY]


def body_row(spec: StreamSpec, body: dict[str, Any]) -> Any:
    """The row inside a report body, after cheap structural checks (ValueError if it cannot be this stream's)."""
    row = body_row_of(body)
    if spec.kind == "haar":
        from protocols.haar import padded_size  # numpy only; keep the contract's import light

        mean, detail = catalogue.haar_row_parts(row)
        _check_row(mean, 1)
        _check_row(detail, padded_size(len(spec.dims)) - 1)
        if not isinstance(detail, list):
            raise ValueError("a haar report's detail is a list")
    elif spec.kind == "numeric":
        _check_row(row, None)
    elif spec.kind == "vector":
        _check_row(row, len(spec.dims) if isinstance(row, list) and len(spec.dims) > 1 else None)
    else:
        _check_row(row, None)
    return row


class Bounds:
    """Declared bounds ``[lo, hi]`` of numeric values (trailing axis = dimensions), checked once
    (:func:`protocols.base.check_bounds`: finite, ``hi > lo``): the clip and the normalisation of SPEC §2.3 for values
    read again and again against the same bounds (a device's readings, :meth:`edge_agent.pipeline.Pipeline.observe`).
    :func:`clip` and :func:`normalise` are these methods with bounds given per call."""

    __slots__ = ("lo", "hi", "_span")

    def __init__(self, lo: Any, hi: Any) -> None:
        self.lo, self.hi = check_bounds(lo, hi)
        self._span = self.hi - self.lo

    def clip(self, x: Any) -> np.ndarray:
        """Clip values to [lo, hi]: a documented bias, never an error (SPEC §2.3). ValueError for non-finite
        values."""
        return np.clip(_finite_values(x), self.lo, self.hi)

    def normalise(self, x: Any) -> np.ndarray:
        """Clip to [lo, hi] and map to [-1, 1]: ``t = 2(x - lo)/(hi - lo) - 1``. ValueError for non-finite
        values."""
        return np.clip(2.0 * (self.clip(x) - self.lo) / self._span - 1.0, -1.0, 1.0)

    def clip_row(self, row: Sequence[float]) -> list[float]:
        """:meth:`clip` of ONE reading of finite floats, one per dimension of 1-D bounds (the caller checked them:
        :func:`edge_agent.readings.check_value`), in Python floats: the same numbers as numpy's ``min(max(x, lo),
        hi)`` without its per-call cost."""
        return [min(max(x, lo), hi) for x, lo, hi in zip(row, self.lo.tolist(), self.hi.tolist(), strict=True)]

    def scale_row(self, row: Sequence[float]) -> list[float]:
        """:meth:`normalise` of ONE reading already in [lo, hi] (:meth:`clip_row`; α-rounded values stay in it), in
        Python floats without a second check and clip: the same operations in the same order, so the same numbers."""
        return [min(max(2.0 * (x - lo) / span - 1.0, -1.0), 1.0)
                for x, lo, span in zip(row, self.lo.tolist(), self._span.tolist(), strict=True)]


def clip(x: Any, lo: Any, hi: Any) -> np.ndarray:
    """Clip values to [lo, hi] (trailing axis = dimensions): a documented bias, never an error (SPEC §2.3). The one
    clip of devices (:meth:`edge_agent.pipeline.Pipeline.observe`, once per reading, through :class:`Bounds`) and
    the fleet simulator. ValueError for non-finite values or bounds without hi > lo."""
    return Bounds(lo, hi).clip(x)


def _finite_values(x: Any) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite; got NaN or infinity")
    return arr


def normalise(x: Any, lo: Any, hi: Any) -> np.ndarray:
    """Clip to [lo, hi] and map to [-1, 1]: ``t = 2(x - lo)/(hi - lo) - 1`` (trailing axis = dimensions; the one
    normalisation of devices, simulations and tests: :meth:`Bounds.normalise`). ValueError for non-finite values or
    bounds without hi > lo."""
    return Bounds(lo, hi).normalise(x)


def denormalise(t: Any, lo: Any, hi: Any) -> np.ndarray:
    """Inverse of :func:`normalise`: ``x = lo + (t + 1)(hi - lo)/2`` (no clipping: estimates may lie outside)."""
    lo_a, hi_a = check_bounds(lo, hi)
    return lo_a + (np.asarray(t, dtype=float) + 1.0) * (hi_a - lo_a) / 2.0


def heavy_hitter_items(spec: HeavyHitterSpec, values: Any) -> np.ndarray:
    """Vectorised map from values in ``[0, 2^bits)`` to this round's oracle items (see :class:`HeavyHitterSpec`):
    :func:`protocols.heavy_hitters.prefix_items` of the spec's candidates, the catch-all item being ``k - 1``."""
    from protocols.heavy_hitters import prefix_items  # here: at import, the contract needs only pydantic, numpy, wire

    v = np.asarray(values, dtype=np.int64)
    if v.size and (v.min() < 0 or v.max() >= (1 << spec.bits)):
        raise ValueError(f"values must lie in [0, 2^{spec.bits})")
    return prefix_items(v, spec.bits, spec.candidates, spec.prefix_bits, spec.step_bits)
