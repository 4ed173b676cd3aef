"""The round-parameter and report-body conventions shared by the coordinator and the edge agent.

This module is the contract (see docs/coordinator.md); it depends only on pydantic, numpy and
:mod:`protocols.wire`, so a device may import it.

**Round parameters.** ``RoundConfig.params`` (:mod:`protocols.wire`) is a :class:`RoundParams`::

    {"streams": {"<stream>": {"kind": "numeric" | "vector" | "frequency" | "haar",
                              "mechanism": "<registry name>", "params": {...},        # not for "haar"
                              "dims": ["cpu", ...], "bounds": [[lo, hi], ...],       # numeric/vector/haar
                              "mean": {"mechanism": ..., "params": {...}},           # "haar" only
                              "detail": {"mechanism": ..., "params": {...}},         # "haar" only
                              "rounding": [step or null per dim] | null,              # α-rounding steps (units of x)
                              "heavy_hitters": {...} | null}}}                        # prefix extension (frequency)

**Report body.** A device's :class:`protocols.wire.Report` for stream ``s`` of round ``r`` carries
``mechanism = StreamSpec.wire_mechanism`` and ``body = {"report": ROW}`` where ROW is
``protocols.registry.row_to_json`` of one row of the mechanism's ``privatize`` output (a scalar or a list).
For ``kind == "haar"`` ROW is ``{"mean": row of the mean mechanism, "detail": row of the detail mechanism}``.

**Normalisation.** Numeric values are clipped to ``[lo, hi]`` and normalised ``t = 2(x - lo)/(hi - lo) - 1``
before privatizing; the coordinator de-normalises ``x = lo + (t + 1)(hi - lo)/2``.

**Haar records** (SPEC §2.4). The d normalised values are zero-padded to D = 2^⌈log2 d⌉ (D ≥ 2,
:func:`protocols.haar.padded_size`) and transformed (:func:`protocols.haar.haar_forward`); the mean ``m`` goes
through the scalar ``mean`` mechanism and the D-1 details through the vector ``detail`` mechanism (``d = D-1``).

**Heavy hitters** (sequentially interactive prefix extension, SPEC §3.13/§5): see :class:`HeavyHitterSpec` and
:func:`heavy_hitter_items`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocols.wire import IDENT

__all__ = [
    "BODY_KEY",
    "HAAR_MECHANISM",
    "StreamKind",
    "MechanismSpec",
    "HeavyHitterSpec",
    "StreamSpec",
    "RoundParams",
    "parse_round_params",
    "make_body",
    "body_row",
    "normalise",
    "denormalise",
    "heavy_hitter_items",
]

#: ``Report.body == {BODY_KEY: row}``.
BODY_KEY = "report"
#: ``Report.mechanism`` of a Haar-record stream.
HAAR_MECHANISM = "haar"

StreamKind = Literal["numeric", "vector", "frequency", "haar"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MechanismSpec(_Model):
    """A mechanism by registry name (:mod:`protocols.registry`) and its constructor parameters."""

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
    """

    bits: int = Field(ge=1, le=62)
    prefix_bits: int = Field(ge=0)
    step_bits: int = Field(ge=1, le=16)
    candidates: list[int] = Field(min_length=1)

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

    def item_prefix(self, item: int) -> int | None:
        """The (prefix_bits + step_bits)-bit prefix an item stands for; None for the catch-all item."""
        if item == self.k - 1:
            return None
        cand, nxt = divmod(int(item), 1 << self.step_bits)
        return (self.candidates[cand] << self.step_bits) | nxt


class StreamSpec(_Model):
    """How one stream is collected in a round (see the module docstring)."""

    kind: StreamKind
    mechanism: str | None = Field(default=None, pattern=IDENT)
    params: dict[str, Any] = Field(default_factory=dict)
    dims: list[str] = Field(min_length=1)
    bounds: list[tuple[float, float]] | None = None
    labels: list[str] | None = None
    mean: MechanismSpec | None = None
    detail: MechanismSpec | None = None
    rounding: list[float | None] | None = None
    heavy_hitters: HeavyHitterSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> "StreamSpec":
        if self.kind == "haar":
            if self.mean is None or self.detail is None:
                raise ValueError("a haar stream needs 'mean' and 'detail' mechanisms")
            if self.mechanism not in (None, HAAR_MECHANISM):
                raise ValueError(f"a haar stream's mechanism is {HAAR_MECHANISM!r}")
        elif self.mechanism is None:
            raise ValueError(f"a {self.kind} stream needs a 'mechanism'")
        if self.kind in ("numeric", "vector", "haar"):
            if self.bounds is None or len(self.bounds) != len(self.dims):
                raise ValueError("numeric streams need one [lo, hi] bound per dimension")
            for lo, hi in self.bounds:
                if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                    raise ValueError(f"bounds must be finite with lo < hi, got [{lo}, {hi}]")
        if self.kind == "numeric" and len(self.dims) != 1:
            raise ValueError("a numeric stream has exactly one dimension (use 'vector' or 'haar')")
        if self.kind == "frequency" and len(self.dims) != 1:
            raise ValueError("a frequency stream has exactly one dimension")
        if self.rounding is not None:
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

    @property
    def epsilon(self) -> float:
        """ε one report of this stream spends (sequential composition of mean and detail for Haar)."""
        if self.kind == "haar":
            assert self.mean is not None and self.detail is not None
            return self.mean.epsilon + self.detail.epsilon
        return float(self.params.get("epsilon", 0.0))

    def lo_hi(self) -> tuple[np.ndarray, np.ndarray]:
        if self.bounds is None:
            raise ValueError("stream has no bounds")
        b = np.asarray(self.bounds, dtype=float)
        return b[:, 0], b[:, 1]


class RoundParams(_Model):
    """``RoundConfig.params`` of a data-collection round."""

    streams: dict[str, StreamSpec] = Field(min_length=1)

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


def body_row(spec: StreamSpec, body: dict[str, Any]) -> Any:
    """The row inside a report body, after cheap structural checks (ValueError if it cannot be this stream's)."""
    if not isinstance(body, dict) or set(body) != {BODY_KEY}:
        raise ValueError(f"body must be {{{BODY_KEY!r}: row}}")
    row = body[BODY_KEY]
    if spec.kind == "haar":
        if not isinstance(row, dict) or set(row) != {"mean", "detail"}:
            raise ValueError("a haar report is {'mean': row, 'detail': row}")
        _check_row(row["mean"], None)
        _check_row(row["detail"], None)
    elif spec.kind == "numeric":
        _check_row(row, None)
    elif spec.kind == "vector":
        _check_row(row, len(spec.dims) if isinstance(row, list) and len(spec.dims) > 1 else None)
    else:
        _check_row(row, None)
    return row


def normalise(x: Any, lo: Any, hi: Any) -> np.ndarray:
    """Clip to [lo, hi] and map to [-1, 1]: ``t = 2(x - lo)/(hi - lo) - 1``."""
    lo_a, hi_a = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    x = np.clip(np.asarray(x, dtype=float), lo_a, hi_a)
    return np.clip(2.0 * (x - lo_a) / (hi_a - lo_a) - 1.0, -1.0, 1.0)


def denormalise(t: Any, lo: Any, hi: Any) -> np.ndarray:
    """Inverse of :func:`normalise`: ``x = lo + (t + 1)(hi - lo)/2`` (no clipping)."""
    lo_a, hi_a = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    return lo_a + (np.asarray(t, dtype=float) + 1.0) * (hi_a - lo_a) / 2.0


def heavy_hitter_items(spec: HeavyHitterSpec, values: Any) -> np.ndarray:
    """Vectorised map from values in ``[0, 2^bits)`` to this round's oracle items (see :class:`HeavyHitterSpec`)."""
    v = np.asarray(values, dtype=np.int64)
    if v.size and (v.min() < 0 or v.max() >= (1 << spec.bits)):
        raise ValueError(f"values must lie in [0, 2^{spec.bits})")
    prefix = v >> (spec.bits - spec.prefix_bits)
    nxt = (v >> (spec.bits - spec.prefix_bits - spec.step_bits)) & ((1 << spec.step_bits) - 1)
    cands = np.asarray(spec.candidates, dtype=np.int64)
    order = np.argsort(cands)
    sorted_c = cands[order]
    pos = np.clip(np.searchsorted(sorted_c, prefix), 0, len(sorted_c) - 1)
    found = sorted_c[pos] == prefix
    idx = order[pos]
    return np.where(found, idx * (1 << spec.step_bits) + nxt, spec.k - 1).astype(np.int64)
