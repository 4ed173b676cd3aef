"""The mechanism catalogue: every mechanism haarvest offers, declared once.

One :class:`Entry` per mechanism holds its **wire name** (what round configurations, device configs and reports
carry), its **class** (``"module:Class"``, imported on first use so a device loads only what it runs), its
**family** (the :class:`~protocols.contract.StreamSpec` kind a stream using it has), the **roles** it can play
(:class:`Role`: a stream's mechanism, a base inside k-sampling, the Haar record's mean or detail part, a candidate
of the ``auto`` policy, …), the **shape of one report row** and the **row codec** (one row ↔ JSON). Every other
module asks the catalogue: there is no second table of names.

The front door (re-exported by :mod:`protocols`), in the manner of IBM diffprivlib's mechanisms::

    from protocols import build
    mech = build("oue", epsilon=1.0, k=10)        # or protocols.OUE(1.0, 10): validated constructor, ValueError
    reports = mech.privatize(values, rng)          # vectorised over users: one row per user
    freq = mech.estimate(reports)                  # unbiased; mech.variance(...) is the analytic variance

A stream's reports reduce to additive **sufficient statistics** (:class:`Statistics`, :meth:`Entry.statistics`):
the coordinator keeps them as reports arrive and estimates from them alone (:meth:`Entry.estimate`), so the cost of
an estimate does not grow with the fleet.

On the wire a device sends ``protocols.contract.make_body(entry(name).encode_row(mech, row))`` for its row, which the coordinator
stacks back with :meth:`Entry.decode_rows`. Longitudinal protocols report through their clients
(``mech.client(...).report(value)``) and are estimated per round (``mech.estimate_round(rows)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from protocols.errors import OffGridError

__all__ = ["Family", "Role", "Entry", "Statistics", "CATALOGUE", "entry", "names", "build", "mechanism_class",
           "protocol_entry", "distribution_entry", "haar_row_parts"]


class Family(StrEnum):
    """What a mechanism reports, named as the :class:`~protocols.contract.StreamSpec` kind of a stream using it."""

    NUMERIC = "numeric"            # one value in [-1, 1] → a grid index (SPEC §3.0)
    VECTOR = "vector"              # d values in [-1, 1] → d grid indices
    FREQUENCY = "frequency"        # a category in [0, k) → integers (a frequency oracle)
    HAAR = "haar"                  # a record in [-1, 1]^d through the Haar transform → D grid indices
    LONGITUDINAL = "longitudinal"  # a category over time, memoized → integers (a longitudinal protocol)
    DISTRIBUTION = "distribution"  # one value on a public grid of D buckets → a fixed-shape row (SPEC §3.14)


class Role(StrEnum):
    """The parts a mechanism can play; :func:`names` lists a role's mechanisms in catalogue order."""

    STREAM = "stream"                  # a stream's mechanism in rounds and device configs
    SCALAR = "scalar"                  # a 1-D pure ε-LDP mechanism built from ε alone (make_scalar_mechanism)
    KSAMPLING_BASE = "ksampling_base"  # a bounded 1-D base inside k-sampling
    HAAR_MEAN = "haar_mean"            # the Haar record's mean-coefficient mechanism
    HAAR_MEAN_AUTO = "haar_mean_auto"  # ... considered by ``mean_mechanism="auto"`` (Duchi is dominated by HM)
    HAAR_DETAIL = "haar_detail"        # the Haar record's detail-coefficient mechanism
    AUTO = "auto"                      # a candidate of the ``auto`` policy (protocols.pipeline.choose_mechanism)
    CHANGE_BOUNDED = "change_bounded"  # charged per released tree node up to a change budget (device unit)
    DISTRIBUTION_ORACLE = "distribution_oracle"  # the bucket / tree-level oracle of a flat or hierarchical distribution


def _scalar_row(_mech: Any) -> tuple[int, ...]:
    return ()


def _k_row(mech: Any) -> tuple[int, ...]:
    return (int(mech.k),)


def _pair_row(_mech: Any) -> tuple[int, ...]:
    return (2,)


def _d_row(mech: Any) -> tuple[int, ...]:
    return (int(mech.d),)


def _haar_row(mech: Any) -> tuple[int, ...]:
    return (int(mech.D),)


def _flat_dist_row(mech: Any) -> tuple[int, ...]:
    """A flat distribution reports its bucket oracle's row: OUE (D,) bits, OLH (2,) [seed, y]."""
    return entry(mech.oracle_name).row_shape(mech.oracle)


def _hierarchical_row(mech: Any) -> tuple[int, ...]:
    """Hierarchical intervals: [level, the leaf-level oracle's row] (``row_width`` values)."""
    return (int(mech.row_width),)


def _haar_hrr_row(_mech: Any) -> tuple[int, ...]:
    return (3,)  # HaarHRR: [level, Hadamard index, ±1]


def _ddrm_row(mech: Any) -> tuple[int, ...]:
    return (1 + int(mech.k),)  # the tree time t, then the k noisy node sums


@dataclass(frozen=True)
class Statistics:
    """Additive sufficient statistics of a set of report rows (:meth:`Entry.statistics`).

    ``n`` rows; ``total`` = Σ over rows of each row's statistic vector v; ``squares`` = Σ v² (numeric families,
    for the plug-in variance; empty for the counting families). Per family, v is: ``debias(row)`` for numeric,
    vector and Haar mechanisms (the unbiased per-user value, Haar: its D coefficients); the row's support
    indicator over ``[0, k)`` for frequency oracles (``total`` = the support counts C_v); the protocol's round
    counts for longitudinal protocols (``round_counts``); the mechanism's ``statistics_moments`` for distributions
    (``squares``: flat OLH's ``Σ_u S_u(m)²``, S_u(m) the number of buckets ≤ m report u supports — the CDF's
    variance, :mod:`protocols.distribution.flat`; empty for the others, and in aggregates kept before it existed,
    which then estimate with the formula). Sums commute, so statistics of disjoint sets of rows add
    (:meth:`__add__`) — across ingest batches and across coordinator workers.
    """

    n: int
    total: np.ndarray
    squares: np.ndarray

    def __add__(self, other: "Statistics") -> "Statistics":
        if self.total.shape != other.total.shape or self.squares.shape != other.squares.shape:
            raise ValueError("statistics of different shapes do not add")
        return Statistics(self.n + other.n, self.total + other.total, self.squares + other.squares)

    @property
    def mean(self) -> np.ndarray:
        return self.total / self.n

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (floats round-trip exactly through ``repr``)."""
        return {"n": int(self.n), "total": self.total.tolist(), "squares": self.squares.tolist()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Statistics":
        return cls(int(data["n"]), np.asarray(data["total"], dtype=float), np.asarray(data["squares"], dtype=float))

    def close_to(self, other: "Statistics", rtol: float = 1e-9) -> bool:
        """Equal up to floating-point summation order (counts exactly, sums to ``rtol`` of their magnitude)."""
        if self.n != other.n or self.total.shape != other.total.shape or self.squares.shape != other.squares.shape:
            return False
        scale = max(1.0, float(np.max(np.abs(self.squares), initial=0.0)), float(np.max(np.abs(self.total), initial=0.0)))
        return bool(np.allclose(self.total, other.total, rtol=0, atol=rtol * scale)
                    and np.allclose(self.squares, other.squares, rtol=0, atol=rtol * scale))


@dataclass(frozen=True)
class Entry:
    """One mechanism: see the module docstring.

    Attributes:
        name: the wire name.
        target: ``"module:Class"``.
        family: what it reports (:class:`Family`).
        roles: the parts it can play (:class:`Role`).
        row: report row shape of a built mechanism (None: its reports are not one row per user on the wire).
        summary: one line for listings and docs.
    """

    name: str
    target: str
    family: Family
    roles: frozenset[Role]
    row: Callable[[Any], tuple[int, ...]] | None
    summary: str
    #: Report rows hold integers: every mechanism releases integers on public grids (SPEC §3.0).
    integer_rows: bool = True
    #: The constructor makes automatic choices (HaarRecord: mean mechanism and split; Hadamard response: its design
    #: rows) that a stream spec states resolved — the built mechanism's ``_params()`` — so both sides build one mechanism.
    resolves_params: bool = False

    @cached_property
    def cls(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    @property
    def integer(self) -> bool:
        """Reports are integers: grid indices, categories, bits or counts — never doubles (SPEC §3.0)."""
        return self.integer_rows

    def build(self, **params: Any) -> Any:
        """Instantiate with ``params`` (validated by the constructor: ValueError on bad values or names)."""
        try:
            return self.cls(**params)
        except TypeError as exc:
            raise ValueError(f"bad parameters for mechanism {self.name!r}: {exc}") from None

    def row_shape(self, mech: Any) -> tuple[int, ...]:
        """The shape of one report row of the built mechanism ``mech``."""
        if self.row is None:
            raise ValueError(f"{self.name!r} does not report one row per user on the wire")
        return self.row(mech)

    def encode_row(self, mech: Any, row: Any) -> Any:
        """One user's report row of the built mechanism ``mech`` as JSON data: an integer or a list of integers; a
        Haar row is ``{"mean": j, "detail": [j_1 … j_{D-1}]}`` (SPEC §2.4). ValueError if the row has not the
        mechanism's row shape or holds anything but integers (a release is never a double, SPEC §3.0)."""
        r = np.asarray(row)
        shape = self.row_shape(mech)
        if r.shape != shape:
            size = f"{shape[0]} values" if len(shape) == 1 else f"shape {shape}"
            raise ValueError(f"a {self.name} report row has {size}, got shape {r.shape}")
        if r.dtype.kind not in "iu":
            raise OffGridError(f"a {self.name} report row holds integers (grid indices), got {r.dtype}")
        if self.family is Family.HAAR:
            return {"mean": int(r[0]), "detail": r[1:].tolist()}
        return r.tolist()

    def decode_rows(self, mech: Any, rows: list[Any]) -> np.ndarray:
        """Many users' JSON rows (as :meth:`encode_row` makes them) stacked into the array ``mech`` decodes: shape
        ``(n, *row_shape)``, integers for integer families. ValueError if they are not such rows."""
        shape = self.row_shape(mech)
        if self.family is Family.HAAR:
            parts = [haar_row_parts(r) for r in rows]
            try:
                means = np.asarray([m for m, _ in parts])
                details = np.asarray([c for _, c in parts])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"a haar wire row is {{'mean': j, 'detail': [j...]}}: {exc}") from None
            if means.ndim != 1 or details.shape != (means.size, shape[0] - 1):
                raise ValueError(f"haar wire rows need 1 mean and {shape[0] - 1} detail values each")
            if means.dtype.kind not in "iu" or (details.size and details.dtype.kind not in "iu"):
                raise OffGridError("haar rows hold integers (grid indices), got real numbers: the old raw-double release")
            return np.concatenate([means[:, None], details.reshape(means.size, -1)], axis=1).astype(np.int64)
        try:
            arr = np.asarray(rows)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self.name} rows do not stack: {exc}") from None
        if arr.shape != (len(rows), *shape):
            raise ValueError(f"{self.name} rows have shape {shape}, got {arr.shape[1:]}")
        if arr.dtype.kind not in ("i", "u"):
            raise OffGridError(f"{self.name} rows hold integers (grid indices), got {arr.dtype}"
                               + (": the old raw-double release" if arr.dtype.kind == "f" else ""))
        return arr.astype(np.int64, copy=False)


    # ------------------------------------------------------------------ sufficient statistics
    def statistics(self, mech: Any, reports: np.ndarray) -> Statistics:
        """The :class:`Statistics` of stacked report rows (``decode_rows`` output) of the built mechanism."""
        n = int(np.asarray(reports).shape[0])
        if self.family in (Family.NUMERIC, Family.VECTOR, Family.HAAR):
            width = int(np.prod(self.row_shape(mech), dtype=np.int64))
            y = np.asarray(mech.debias(reports), dtype=float).reshape(n, width) if n else np.zeros((0, width))
            return Statistics(n, y.sum(axis=0), (y**2).sum(axis=0))
        if self.family is Family.DISTRIBUTION:
            if n == 0:
                return Statistics(0, np.zeros(int(mech.statistics_size)), np.zeros(int(mech.squares_size)))
            total, squares = mech.statistics_moments(reports)
            return Statistics(int(mech.n_reports(reports)), np.asarray(total, dtype=float),
                              np.asarray(squares, dtype=float))
        if self.family is Family.FREQUENCY:
            size, counts, users = mech.k, mech.support_counts, mech.n_reports
        else:
            size, counts, users = mech.k, mech.round_counts, len
        if n == 0:
            return Statistics(0, np.zeros(int(size)), np.zeros(0))
        return Statistics(int(users(reports)), np.asarray(counts(reports), dtype=float), np.zeros(0))

    def distribution(self, mech: Any, stats: Statistics, level: float = 0.95, edges: Any = None) -> Any:
        """A distribution stream's :class:`~protocols.distribution.DistributionEstimate` (histogram, CDF,
        quantiles with intervals) from its statistics alone."""
        if self.family is not Family.DISTRIBUTION:
            raise ValueError(f"{self.name!r} is not a distribution mechanism")
        if stats.n <= 0:
            raise ValueError("cannot estimate from zero reports")
        return mech.distribution_from_statistics(stats.total, stats.n, level, edges, stats.squares)

    def estimate(self, mech: Any, stats: Statistics) -> np.ndarray:
        """The mechanism's unbiased estimate from statistics alone — equal to its estimate from the rows
        (``estimate`` / ``estimate_round``): means for numeric and vector mechanisms, ``haar_inverse`` of the mean
        coefficients for the Haar record, ``(C/n − q)/(p − q)`` or the protocol's own debiasing for counts, the
        histogram over the D buckets for distributions (:meth:`distribution` adds the CDF and quantiles)."""
        if stats.n <= 0:
            raise ValueError("cannot estimate from zero reports")
        if self.family is Family.DISTRIBUTION:
            return np.asarray(mech.estimate_statistics(stats.total, stats.n), dtype=float).reshape(-1)
        if self.family in (Family.FREQUENCY, Family.LONGITUDINAL):
            return np.asarray(mech.estimate_counts(stats.total, stats.n), dtype=float).reshape(-1)
        if self.family is Family.HAAR:
            from protocols.haar import haar_inverse

            mean = stats.mean
            return np.asarray(haar_inverse(mean[0], mean[1:], mech.d), dtype=float).reshape(-1)
        return stats.mean


def haar_row_parts(row: Any) -> tuple[Any, Any]:
    """``(mean, detail)`` of a Haar wire row (:meth:`Entry.encode_row`); ValueError unless the row is exactly
    ``{"mean": y, "detail": [z...]}`` — the one structural check of a Haar row (the contract's ``body_row`` and the
    codec's ``decode_rows``)."""
    if not isinstance(row, dict) or set(row) != {"mean", "detail"}:
        raise ValueError("a haar wire row is {'mean': y, 'detail': [z...]}")
    return row["mean"], row["detail"]


def _entry(name: str, target: str, family: Family, roles: Iterable[Role], row: Callable[[Any], tuple[int, ...]] | None,
           summary: str, resolves_params: bool = False) -> Entry:
    return Entry(name, target, family, frozenset(roles), row, summary, True, resolves_params)


_S, _KB, _HM, _HA, _HD, _A = Role.STREAM, Role.KSAMPLING_BASE, Role.HAAR_MEAN, Role.HAAR_MEAN_AUTO, Role.HAAR_DETAIL, Role.AUTO
_DO = Role.DISTRIBUTION_ORACLE
_N, _V, _F, _H, _L = Family.NUMERIC, Family.VECTOR, Family.FREQUENCY, Family.HAAR, Family.LONGITUDINAL

#: Every mechanism, in the order listings show them (SPEC §3 numbers in the summaries).
CATALOGUE: tuple[Entry, ...] = (
    # numeric, inputs in [-1, 1] (SPEC §3.1–3.7)
    _entry("laplace", "protocols.numeric:Laplace", _N, (_S, Role.SCALAR), _scalar_row, "Laplace, ε-LDP (§3.1)"),
    _entry("gaussian", "protocols.numeric:Gaussian", _N, (_S,), _scalar_row, "Gaussian, (ε, δ)-LDP (§3.1)"),
    _entry("pdp", "protocols.numeric:PDP", _N, (_S, Role.SCALAR, _KB, _HM, _HA), _scalar_row,
           "PDP, ε-LDP as corrected in SPEC §3.5"),
    _entry("piecewise", "protocols.numeric:Piecewise", _N, (_S, Role.SCALAR, _KB, _HM, _HA), _scalar_row,
           "Piecewise mechanism (Wang et al. 2019), ε-LDP (§3.3)"),
    _entry("hybrid", "protocols.numeric:Hybrid", _N, (_S, Role.SCALAR, _KB, _HM, _HA, _A), _scalar_row,
           "Hybrid mechanism (Wang et al. 2019), ε-LDP (§3.4)"),
    _entry("duchi", "protocols.numeric:Duchi", _N, (_S, Role.SCALAR, _KB, _HM), _scalar_row, "Duchi et al., ε-LDP (§3.2)"),
    _entry("ksampling", "protocols.numeric:KSampling", _V, (_S, _HD, _A), _d_row, "k-sampling over d coordinates (§3.6)"),
    _entry("duchi_md", "protocols.numeric:DuchiMultiDim", _V, (_S, _HD, _A), _d_row, "Duchi multi-dimensional (§3.7)"),
    # frequency oracles, inputs in [0, k) (SPEC §3.8)
    _entry("grr", "protocols.frequency:GRR", _F, (_S, _A), _scalar_row, "generalised randomised response"),
    _entry("sue", "protocols.frequency:SUE", _F, (_S,), _k_row, "symmetric unary encoding (basic RAPPOR)"),
    _entry("oue", "protocols.frequency:OUE", _F, (_S, _A, _DO), _k_row, "optimised unary encoding"),
    _entry("blh", "protocols.frequency:BLH", _F, (_S,), _pair_row, "binary local hashing"),
    _entry("olh", "protocols.frequency:OLH", _F, (_S, _A, _DO), _pair_row, "optimised local hashing"),
    _entry("hr", "protocols.frequency:HadamardResponse", _F, (_S,), _scalar_row, "Hadamard response",
           resolves_params=True),
    # records in [-1, 1]^d: the memoized pipeline's Haar record mechanism (SPEC §2.4)
    _entry("haar", "protocols.pipeline:HaarRecord", _H, (_S, _A), _haar_row, "Haar record: mean + details (§2.4)",
           resolves_params=True),
    # distributions of one numeric dimension on a public grid of D buckets (SPEC §3.14); params epsilon, D, …
    _entry("distribution_flat", "protocols.distribution:FlatOracle", Family.DISTRIBUTION, (_S,), _flat_dist_row,
           "bucket + OUE/OLH over D buckets (§3.14)"),
    _entry("distribution_hierarchical", "protocols.distribution:HierarchicalIntervals", Family.DISTRIBUTION, (_S,),
           _hierarchical_row, "hierarchical intervals, one sampled level per user (§3.14)"),
    _entry("distribution_haar", "protocols.distribution:HaarDistribution", Family.DISTRIBUTION, (_S,), _haar_hrr_row,
           "HaarHRR over D buckets (§3.14)"),
    _entry("distribution_square_wave", "protocols.distribution:SquareWave", Family.DISTRIBUTION, (_S,), _scalar_row,
           "Square Wave + EMS over D buckets (§3.14)"),
    # longitudinal protocols (SPEC §3.9–3.10): streams use the first three
    _entry("lgrr", "protocols.longitudinal:LGRR", _L, (_S,), _scalar_row, "L-GRR, memoized GRR (§3.9)"),
    _entry("loloha", "protocols.longitudinal:LOLOHA", _L, (_S,), _pair_row, "LOLOHA (Arcolezi et al. 2023) (§3.10)"),
    _entry("ddrm", "protocols.longitudinal:CategoricalDDRM", _L, (_S, Role.CHANGE_BOUNDED), _ddrm_row,
           "DDRM over k categories: change-bounded tree protocol"),
    _entry("ddrm_mean", "protocols.longitudinal:DDRM", _L, (), None, "DDRM for a sparse numeric change (evaluation)"),
    _entry("losue", "protocols.longitudinal:LOSUE", _L, (), None, "L-OSUE (evaluation)"),
    _entry("lsue", "protocols.longitudinal:LSUE", _L, (), None, "L-SUE (evaluation)"),
    _entry("dbitflip", "protocols.longitudinal:DBitFlipPM", _L, (), None, "Microsoft's dBitFlipPM (evaluation)"),
    _entry("onebit_mean", "protocols.longitudinal:OneBitMeanMemo", _L, (), None, "1BitMean with memoization (evaluation)"),
    _entry("rappor", "protocols.longitudinal:RAPPOR", _L, (), None, "RAPPOR (evaluation)"),
)

_BY_NAME: dict[str, Entry] = {e.name: e for e in CATALOGUE}


def entry(name: Any) -> Entry:
    """The catalogue entry of wire name ``name`` (ValueError naming the known ones otherwise)."""
    found = _BY_NAME.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(sorted(_BY_NAME))}")
    return found


def names(role: Role | None = None, family: Family | None = None) -> tuple[str, ...]:
    """Wire names (catalogue order) that can play ``role`` and belong to ``family`` (None: any)."""
    return tuple(e.name for e in CATALOGUE
                 if (role is None or role in e.roles) and (family is None or e.family is family))


def mechanism_class(name: str) -> type:
    """The class of mechanism ``name``."""
    return entry(name).cls


def build(name: str, **params: Any) -> Any:
    """Instantiate mechanism ``name`` with ``params`` (validated by its constructor: ValueError on bad values)."""
    return entry(name).build(**params)


def protocol_entry(protocol_name: str) -> Entry:
    """The entry of a longitudinal protocol by its ``name`` attribute (``"L-GRR"``, ``"DDRM-k"``: what device state
    persists), ValueError otherwise."""
    for e in CATALOGUE:
        if e.family is Family.LONGITUDINAL and getattr(e.cls, "name", None) == protocol_name:
            return e
    known = sorted(str(e.cls.name) for e in CATALOGUE if e.family is Family.LONGITUDINAL)
    raise ValueError(f"unknown longitudinal protocol {protocol_name!r}; known: {known}")


def distribution_entry(mech: Any) -> Entry:
    """The entry of a built distribution mechanism (what ``auto``'s choice is sent as: this name and
    ``mech._params()``), ValueError otherwise."""
    for e in CATALOGUE:
        if e.family is Family.DISTRIBUTION and type(mech) is e.cls:
            return e
    raise ValueError(f"{type(mech).__name__} is not a catalogued distribution mechanism")

