"""Privacy accounting (SPEC §4): charges per stream and their composition.

Composition theorems implemented (all give an (ε, δ) guarantee for everything charged):

* **Basic sequential composition**: ``(Σ ε_i, Σ δ_i)``.
* **Parallel composition**: streams declared *disjoint* (they act on disjoint parts of the data, so one datum is
  touched by at most one of them) compose by ``max`` instead of ``Σ``; groups are declared by the caller.
* **Advanced composition** (Dwork, Rothblum, Vadhan FOCS 2010; source 000): k mechanisms of ε each are
  ``(ε·√(2k·ln(1/δ')) + k·ε·(e^ε - 1), kδ + δ')``-DP. For unequal ε_i the same proof (Azuma on the privacy-loss
  martingale, mean ≤ ε_i(e^{ε_i}-1), increments ≤ ε_i) gives ``√(2 ln(1/δ')·Σε_i²) + Σ ε_i(e^{ε_i} - 1)``,
  which is what is computed (it reduces to the formula above for equal ε).
* **Rényi DP** (Mironov, CSF 2017; source 002): a mechanism is (α, ρ(α))-RDP when
  ``D_α(M(x) ‖ M(x')) ≤ ρ(α)`` for all neighbours. RDP curves of adaptively composed mechanisms add pointwise
  (source 002, Proposition 1); the sum is converted by ``ε(δ) = min_α [ρ(α) + log(1/δ)/(α - 1)]`` (Mironov
  2017, RDP-to-(ε, δ) conversion), over a grid of orders α.

RDP curves (:class:`RDPCurve`):

* binary randomized response at ε, ``p = e^ε/(1+e^ε)``, q = 1 - p:
  ``D_α = log(p^α q^{1-α} + q^α p^{1-α}) / (α - 1)``;
* GRR with k outputs, ``p = e^ε/(e^ε+k-1)``, ``q = 1/(e^ε+k-1)``; the worst pair of inputs x ≠ x' differ on the
  two outputs x, x', so ``D_α = log(p^α q^{1-α} + q^α p^{1-α} + (k-2)·q) / (α - 1)``;
* any pure ε-LDP mechanism: the binary-RR curve at ε (Mironov 2017: an ε-DP mechanism is
  (α, (1/(α-1))·log[(sinh(αε) - sinh((α-1)ε))/sinh(ε)])-RDP, which equals the RR curve since
  ``p^α q^{1-α} + q^α p^{1-α} = cosh((α-½)ε)/cosh(ε/2)``; RR attains it, so no better generic bound exists);
* Gaussian with L2 sensitivity Δ and noise σ: ``α·Δ²/(2σ²)`` (SPEC §3.7).

A charge without a curve is treated as pure ε-LDP when δ = 0; an (ε, δ>0) charge without a curve is composed
sequentially outside the RDP sum (``ε_RDP(δ') + Σ ε_j``, ``δ' + Σ δ_j``), which is valid by basic composition.

**Memoization** (SPEC §4): a report served from the memo table is post-processing and costs 0;
:meth:`Accountant.charge_memo` charges only when the (opaque, e.g. HMAC) key is new for that stream. Longitudinal
bounds: one formula, :func:`memo_slots_bound` (ε per memo slot), specialised by :func:`loloha_bound`,
:func:`alpha_rounding_bound`, :func:`dbitflip_bound` and every protocol's ``longitudinal_bound``.

**One cap rule** (:func:`check_cap`) for this in-memory accountant and for the device's persistent ledger
(:mod:`edge_agent.state`, which keeps the charges in SQLite and checks them with the same function), and one δ
rule (:func:`check_delta_cap`). **One charge rule**: :func:`report_charge` is what one report (value unit: one new
memo entry) is charged under a privacy unit, :func:`memo_charge` what a report costs given a memo hit (0) or
miss — the device's plans and ledger (:mod:`edge_agent.plans`, :mod:`edge_agent.state`) and
:meth:`Accountant.charge_memo` call them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.base import check_delta, check_epsilon, check_int
from protocols.errors import BudgetExceededError  # noqa: F401 (part of this module's API: Accountant raises it)

__all__ = [
    "DEFAULT_ORDERS",
    "RDPCurve",
    "rdp_randomized_response",
    "rdp_grr",
    "rdp_pure",
    "rdp_gaussian",
    "rdp_to_dp",
    "basic_composition",
    "advanced_composition",
    "memo_slots_bound",
    "loloha_bound",
    "alpha_rounding_bound",
    "dbitflip_bound",
    "CAP_TOLERANCE",
    "check_cap",
    "check_delta_cap",
    "PRIVACY_UNITS",
    "report_charge",
    "memo_charge",
    "Charge",
    "SpendReport",
    "BudgetExceededError",
    "Accountant",
]

#: Rényi orders α > 1 used by the accountant (dense near 1–10, where conversions for moderate ε land).
DEFAULT_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 9.0, 10.0,
    12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0,
)  # fmt: skip


def _orders(orders: Any) -> np.ndarray:
    arr = np.asarray(orders, dtype=float).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 1):
        raise ValueError("Rényi orders must be finite numbers > 1")
    return arr


def _rr_like_divergence(log_p: float, log_q: float, rest: float, orders: np.ndarray) -> np.ndarray:
    """log(p^α q^{1-α} + q^α p^{1-α} + rest)/(α-1), stably (log-sum-exp)."""
    a = orders
    t1 = a * log_p + (1 - a) * log_q
    t2 = a * log_q + (1 - a) * log_p
    terms = [t1, t2] if rest <= 0 else [t1, t2, np.full_like(a, math.log(rest))]
    return np.logaddexp.reduce(np.stack(terms), axis=0) / (a - 1)


@dataclass(frozen=True)
class RDPCurve:
    """An RDP curve ρ(α) given by a named family and its parameters (plain data, serialisable).

    ``kind`` ∈ {"rr", "grr", "pure", "gaussian"}; ``params`` holds ε (and k), or σ and the sensitivity.
    Evaluate with ``curve(orders)``.
    """

    kind: str
    params: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if self.kind not in {"rr", "grr", "pure", "gaussian"}:
            raise ValueError(f"unknown RDP curve kind {self.kind!r}")

    def param(self, name: str) -> float:
        return dict(self.params)[name]

    def __call__(self, orders: Any) -> np.ndarray:
        a = _orders(orders)
        if self.kind in {"rr", "pure"}:
            eps = self.param("epsilon")
            log_p = eps - math.log1p(math.exp(eps))
            log_q = -math.log1p(math.exp(eps))
            return np.minimum(_rr_like_divergence(log_p, log_q, 0.0, a), eps)
        if self.kind == "grr":
            eps, k = self.param("epsilon"), int(self.param("k"))
            log_den = math.log(math.exp(eps) + k - 1)
            log_p, log_q = eps - log_den, -log_den
            return np.minimum(_rr_like_divergence(log_p, log_q, (k - 2) * math.exp(log_q), a), eps)
        sigma, sens = self.param("sigma"), self.param("sensitivity")
        return a * sens**2 / (2 * sigma**2)

    def to_state(self) -> dict[str, Any]:
        return {"kind": self.kind, **dict(self.params)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RDPCurve:
        kind = state.get("kind")
        if kind in {"rr", "pure"}:
            return rdp_randomized_response(state["epsilon"]) if kind == "rr" else rdp_pure(state["epsilon"])
        if kind == "grr":
            return rdp_grr(state["epsilon"], int(state["k"]))
        if kind == "gaussian":
            return rdp_gaussian(state["sigma"], state["sensitivity"])
        raise ValueError(f"unknown RDP curve state {dict(state)!r}")


def rdp_randomized_response(epsilon: float) -> RDPCurve:
    """Binary RR at ε: ``D_α = log(p^α q^{1-α} + q^α p^{1-α})/(α-1)``, p = e^ε/(1+e^ε)."""
    return RDPCurve("rr", (("epsilon", check_epsilon(epsilon)),))


def rdp_grr(epsilon: float, k: int) -> RDPCurve:
    """GRR over k values at ε: ``D_α = log(p^α q^{1-α} + q^α p^{1-α} + (k-2)q)/(α-1)``."""
    return RDPCurve("grr", (("epsilon", check_epsilon(epsilon)), ("k", float(check_int(k, "k", minimum=2)))))


def rdp_pure(epsilon: float) -> RDPCurve:
    """Any ε-LDP mechanism (Mironov 2017; equal to the binary-RR curve, capped at ε)."""
    return RDPCurve("pure", (("epsilon", check_epsilon(epsilon)),))


def rdp_gaussian(sigma: float, sensitivity: float = 1.0) -> RDPCurve:
    """Gaussian mechanism: ``ρ(α) = α·Δ²/(2σ²)``."""
    return RDPCurve(
        "gaussian", (("sigma", check_epsilon(sigma, "sigma")), ("sensitivity", check_epsilon(sensitivity, "sensitivity")))
    )


def rdp_to_dp(rdp: Any, orders: Any, delta: float) -> tuple[float, float]:
    """``ε(δ) = min_α [ρ(α) + log(1/δ)/(α-1)]`` over the grid; returns (ε, the minimising α)."""
    a = _orders(orders)
    rho = np.asarray(rdp, dtype=float).reshape(-1)
    if rho.shape != a.shape:
        raise ValueError(f"rdp values ({rho.size}) and orders ({a.size}) differ in length")
    delta = check_delta(delta)
    eps = rho + math.log(1 / delta) / (a - 1)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


def basic_composition(epsilons: Iterable[float], deltas: Iterable[float] | None = None) -> tuple[float, float]:
    """Sequential composition ``(Σ ε_i, Σ δ_i)``."""
    eps = [float(e) for e in epsilons]
    dts = [] if deltas is None else [float(d) for d in deltas]
    return float(math.fsum(eps)), float(math.fsum(dts))


def advanced_composition(epsilons: Iterable[float], delta_prime: float) -> tuple[float, float]:
    """``(√(2 ln(1/δ')·Σε_i²) + Σ ε_i(e^{ε_i} - 1), δ')`` (add the mechanisms' own Σδ_i to δ')."""
    delta_prime = check_delta(delta_prime, "delta_prime")
    eps = np.asarray(list(epsilons), dtype=float)
    return _advanced_from_sums(float(np.sum(eps**2)), float(np.sum(eps * np.expm1(eps))), delta_prime), delta_prime


def _advanced_from_sums(sum_sq: float, sum_drift: float, delta_prime: float) -> float:
    return math.sqrt(2 * math.log(1 / delta_prime) * sum_sq) + sum_drift


def memo_slots_bound(epsilon: float, slots: int, n_distinct: int | None = None) -> float:
    """The one longitudinal bound of memoization (SPEC §4): a memoized report is charged ε once per memo slot it
    fills and re-sent for free, so a device that can fill at most ``slots`` slots — and has filled ``n_distinct``
    of them, when known — spends at most ``ε·min(slots, n_distinct)`` whatever the number of reports.
    Every protocol's ``longitudinal_bound`` and the bounds below are this formula."""
    slots = check_int(slots, "slots", minimum=0)
    if n_distinct is not None:
        slots = min(slots, check_int(n_distinct, "n_distinct", minimum=0))
    return check_epsilon(epsilon) * slots


def loloha_bound(g: int, eps_inf: float, k: int | None = None, n_distinct: int | None = None) -> float:
    """LOLOHA long-run spend: ``ε∞·min(g, k, n_distinct)`` — at most g hashed values (Arcolezi et al. 2023; SPEC
    §3.10), never more than the k values of the domain or the values seen, whatever the number of changes."""
    slots = check_int(g, "g", minimum=2)
    if k is not None:
        slots = min(slots, check_int(k, "k", minimum=2))
    return memo_slots_bound(check_epsilon(eps_inf, "eps_inf"), slots, n_distinct)


def alpha_rounding_bound(grid_points_used: int, epsilon: float) -> float:
    """α-rounding with memoization: at most ``(#grid points used)·ε`` (Ding et al. 2017; SPEC §4)."""
    return memo_slots_bound(epsilon, check_int(grid_points_used, "grid_points_used", minimum=0))


def dbitflip_bound(d: int, b: int, epsilon: float, n_distinct: int | None = None) -> float:
    """dBitFlipPM with memoization: at most ``min(d+1, b, n_distinct)·ε`` (Ding et al. 2017; SPEC §4)."""
    d = check_int(d, "d", minimum=1)
    b = check_int(b, "b", minimum=1)
    return memo_slots_bound(epsilon, min(d + 1, b), n_distinct)


#: Relative slack of the cap rule: float sums of charges may overshoot an exactly reachable cap by rounding.
CAP_TOLERANCE = 1e-12


def check_cap(reason: str, spent: float, charge: float, cap: float | None, what: str = "", cap_name: str = "cap") -> None:
    """The one cap rule of both ledgers (the device's SQLite ledger, :mod:`edge_agent.state`, and
    :class:`Accountant`): a charge is allowed iff ``spent + charge ≤ cap`` (basic composition; up to
    :data:`CAP_TOLERANCE` relative slack). Raises :class:`BudgetExceededError` with ``reason`` otherwise;
    ``cap`` None means uncapped. The message reads ``<what> spent S + C > <cap_name> CAP``."""
    if cap is None:
        return
    if spent + charge > cap * (1 + CAP_TOLERANCE):
        label = f"{what} " if what else ""
        raise BudgetExceededError(reason, f"{label}spent {spent:.6g} + {charge:.6g} > {cap_name} {cap:.6g}")


def check_delta_cap(spent: float, delta: float, cap: float | None) -> None:
    """The δ rule of both ledgers: basic composition of (ε, δ) charges, ``Σδ + δ ≤ cap`` (:func:`check_cap`). A
    charge with δ > 0 needs δ < 1 and a cap — ``cap`` None refuses every δ > 0 (a ledger that admits (ε, δ) charges
    states how much δ it allows: a device's ``ledger.delta_cap``); δ = 0 passes. Raises
    :class:`BudgetExceededError` ``"delta_cap"``."""
    if delta > 0:
        if not delta < 1:
            raise BudgetExceededError("delta_cap", f"δ = {delta!r} is not in (0, 1)")
        if cap is None:
            raise BudgetExceededError("delta_cap", "an (ε, δ) charge needs ledger.delta_cap")
        check_cap("delta_cap", spent, delta, cap, "δ")


#: The privacy units a charge can be true for (SPEC §4; a device's ``privacy.unit``).
PRIVACY_UNITS = ("device", "value")


def report_charge(name: str, mechanism: Any, epsilon: float, unit: str) -> float:
    """ε a ledger charges for one report of catalogue mechanism ``name`` (built: ``mechanism``) run at ``epsilon``.

    ``value`` unit: ε (ε∞ for longitudinal chains) per *new* memo entry (:func:`memo_charge`: 0 for a memo hit).
    ``device`` unit: every report is charged, and the charge bounds the report's contribution to the
    whole-transcript log-likelihood ratio against any other readings: a fresh mechanism's ε (sequential
    composition over independent randomizations); for a longitudinal chain the IRR's ε for an arbitrary change of
    its input (``irr_input_epsilon``): the PRR table is drawn independently of the data, so conditioned on it the
    reports are independent IRRs and each one changes the ratio by at most that factor
    (:mod:`protocols.longitudinal.base`, bound 2). A change-bounded tree (DDRM, either unit) is charged the most one
    tree can charge, ``device_epsilon(horizon)``.
    """
    from protocols import catalogue  # the catalogue is light; imported here to keep this module's import minimal

    if unit not in PRIVACY_UNITS:
        raise ValueError(f"unit must be one of {', '.join(PRIVACY_UNITS)}, got {unit!r}")
    entry = catalogue.entry(name)
    if catalogue.Role.CHANGE_BOUNDED in entry.roles:
        return float(mechanism.device_epsilon(mechanism.horizon))
    if unit == "device" and entry.family is catalogue.Family.LONGITUDINAL:
        return float(mechanism.irr_input_epsilon)
    return float(epsilon)


def memo_charge(epsilon: float, *, memo_hit: bool) -> float:
    """What a report costs given its memo lookup (SPEC §4): a report served from the memo table is post-processing
    and costs 0; a new entry costs its ε."""
    return 0.0 if memo_hit else float(epsilon)


@dataclass(frozen=True)
class Charge:
    """One recorded spend: ``kind`` is "report" (a fresh report) or "memo" (a new memo entry, with its key)."""

    stream: str
    mechanism: str
    epsilon: float
    delta: float = 0.0
    rdp: RDPCurve | None = None
    kind: str = "report"
    memo_key: str | None = None

    def to_state(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rdp": None if self.rdp is None else self.rdp.to_state(),
            "kind": self.kind,
            "memo_key": self.memo_key,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Charge:
        rdp = state.get("rdp")
        return cls(
            stream=str(state["stream"]),
            mechanism=str(state["mechanism"]),
            epsilon=check_epsilon(state["epsilon"]),
            delta=check_delta(state.get("delta", 0.0), allow_zero=True),
            rdp=None if rdp is None else RDPCurve.from_state(rdp),
            kind=str(state.get("kind", "report")),
            memo_key=state.get("memo_key"),
        )


@dataclass(frozen=True)
class SpendReport:
    """Spend under each composition theorem. Each (ε, δ) pair is a valid guarantee on its own.

    ``best_epsilon`` is the smallest of the three ε, valid with its own δ (at most the largest δ among them).
    """

    n_charges: int
    basic: tuple[float, float]
    advanced: tuple[float, float]
    rdp: tuple[float, float]
    rdp_order: float
    target_delta: float

    @property
    def best_epsilon(self) -> float:
        return min(self.basic[0], self.advanced[0], self.rdp[0])


@dataclass
class _Totals:
    """Sufficient statistics of a set of charges for all three theorems."""

    eps: float = 0.0
    delta: float = 0.0
    sum_sq: float = 0.0
    sum_drift: float = 0.0
    rdp: np.ndarray = field(default_factory=lambda: np.zeros(0))
    extra_eps: float = 0.0  # (ε, δ>0) charges without an RDP curve
    extra_delta: float = 0.0

    @staticmethod
    def worst(items: Sequence[_Totals], n_orders: int) -> _Totals:
        """Parallel composition: componentwise max (each statistic is monotone in every bound)."""
        if not items:
            return _Totals(rdp=np.zeros(n_orders))
        return _Totals(
            eps=max(t.eps for t in items),
            delta=max(t.delta for t in items),
            sum_sq=max(t.sum_sq for t in items),
            sum_drift=max(t.sum_drift for t in items),
            rdp=np.max(np.stack([t.rdp for t in items]), axis=0),
            extra_eps=max(t.extra_eps for t in items),
            extra_delta=max(t.extra_delta for t in items),
        )

    @staticmethod
    def total(items: Sequence[_Totals], n_orders: int) -> _Totals:
        """Sequential composition of independent units: sums."""
        out = _Totals(rdp=np.zeros(n_orders))
        for t in items:
            out.eps += t.eps
            out.delta += t.delta
            out.sum_sq += t.sum_sq
            out.sum_drift += t.sum_drift
            out.rdp = out.rdp + t.rdp
            out.extra_eps += t.extra_eps
            out.extra_delta += t.extra_delta
        return out


class Accountant:
    """Records charges per stream and reports their composition (basic, parallel, advanced, RDP).

    * ``charge(stream, mechanism, epsilon, delta=0, rdp=None)`` records a fresh report's spend;
    * ``charge_memo(stream, key, epsilon, ...)`` charges only when ``key`` is new for ``stream`` (returns whether
      it charged); a repeated key is served from the memo table for free;
    * ``declare_disjoint(group, streams)``: those streams touch disjoint data → parallel composition (max);
    * ``report(delta, stream=None)``: :class:`SpendReport` for one stream or for everything;
    * optional caps (basic composition, the conservative device-side rule): ``set_cap(stream, ε)``, ``total_cap``
      and ``delta_cap`` (Σδ, :func:`check_delta_cap`, the device's rule; without a ``delta_cap`` the cap is
      infinite — δ > 0 charges are admitted for analysis, which a device without ``ledger.delta_cap`` refuses); a charge that would exceed one
      raises :class:`BudgetExceededError` and records nothing.

    State is plain data (:meth:`to_state` / :meth:`from_state`) so a ledger can persist it.
    """

    def __init__(self, orders: Sequence[float] | None = None, total_cap: float | None = None,
                 delta_cap: float | None = None) -> None:
        self.orders = _orders(DEFAULT_ORDERS if orders is None else orders)
        self.total_cap = None if total_cap is None else check_epsilon(total_cap, "total_cap")
        self.delta_cap = None if delta_cap is None else check_delta(delta_cap, "delta_cap")
        self._charges: list[Charge] = []
        self._memo: dict[str, set[str]] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        self._caps: dict[str, float] = {}
        self._curve_cache: dict[RDPCurve, np.ndarray] = {}

    # ------------------------------------------------------------ recording
    def set_cap(self, stream: str, epsilon: float) -> None:
        """Cap a stream's basic-composition spend."""
        self._caps[_check_name(stream, "stream")] = check_epsilon(epsilon, "cap")

    def declare_disjoint(self, group: str, streams: Iterable[str]) -> None:
        """Declare that ``streams`` act on disjoint data (parallel composition: the group costs the max)."""
        group = _check_name(group, "group")
        members = tuple(dict.fromkeys(_check_name(s, "stream") for s in streams))
        if len(members) < 2:
            raise ValueError("a disjoint group needs at least two streams")
        for other, others in self._groups.items():
            if other != group and set(members) & set(others):
                raise ValueError(f"streams {sorted(set(members) & set(others))} already belong to group {other!r}")
        self._groups[group] = members

    def charge(
        self,
        stream: str,
        mechanism: str,
        epsilon: float,
        delta: float = 0.0,
        rdp: RDPCurve | None = None,
        *,
        kind: str = "report",
        memo_key: str | None = None,
    ) -> Charge:
        """Record one charge (after checking caps); returns it."""
        c = Charge(
            stream=_check_name(stream, "stream"),
            mechanism=_check_name(mechanism, "mechanism"),
            epsilon=check_epsilon(epsilon),
            delta=check_delta(delta, allow_zero=True),
            rdp=rdp,
            kind=kind,
            memo_key=memo_key,
        )
        if rdp is not None and not isinstance(rdp, RDPCurve):
            raise ValueError("rdp must be an RDPCurve (see rdp_randomized_response, rdp_grr, ...)")
        if kind not in {"report", "memo"}:
            raise ValueError(f"kind must be 'report' or 'memo', got {kind!r}")
        self._check_caps(c)
        self._charges.append(c)
        if memo_key is not None:
            self._memo.setdefault(c.stream, set()).add(memo_key)
        return c

    def charge_memo(
        self,
        stream: str,
        key: str,
        epsilon: float,
        mechanism: str = "memo",
        delta: float = 0.0,
        rdp: RDPCurve | None = None,
    ) -> bool:
        """Charge ε for a new memo entry; a key already seen on this stream costs nothing. Returns True if charged."""
        key = _check_name(key, "memo key")
        hit = self.has_memo(stream, key)
        if not hit:  # a hit records nothing (its cost, memo_charge, is 0)
            self.charge(stream, mechanism, memo_charge(epsilon, memo_hit=hit), delta, rdp, kind="memo", memo_key=key)
        return not hit

    def has_memo(self, stream: str, key: str) -> bool:
        return key in self._memo.get(stream, ())

    def memo_count(self, stream: str) -> int:
        """Distinct memo keys charged on ``stream`` (e.g. grid points used, for :func:`alpha_rounding_bound`)."""
        return len(self._memo.get(stream, ()))

    def _check_caps(self, c: Charge) -> None:
        cap = self._caps.get(c.stream)
        if cap is not None:
            spent = self._unit_totals(c.stream, with_rdp=False).eps
            check_cap("stream_cap", spent, c.epsilon, cap, f"stream {c.stream!r}")
        if self.total_cap is not None:  # with parallel composition a charge may add less than its ε to the total
            before = self._unit_totals(with_rdp=False).eps
            after = self._unit_totals(extra=c, with_rdp=False).eps
            check_cap("total_cap", before, after - before, self.total_cap, "total", "total cap")
        # as for the total: a disjoint group's δ counts its worst stream. The device's rule (check_delta_cap),
        # with this ledger's "no delta_cap" read as an infinite cap: the Accountant also composes (ε, δ) charges
        # for analysis (report(), the Gaussian RDP curves), where δ is stated, not capped.
        before_t, after_t = self._unit_totals(with_rdp=False), self._unit_totals(extra=c, with_rdp=False)
        check_delta_cap(before_t.delta, after_t.delta - before_t.delta,
                        math.inf if self.delta_cap is None else self.delta_cap)

    # ------------------------------------------------------------ queries
    @property
    def charges(self) -> list[Charge]:
        return list(self._charges)

    def streams(self) -> list[str]:
        return list(dict.fromkeys(c.stream for c in self._charges))

    def groups(self) -> dict[str, tuple[str, ...]]:
        return dict(self._groups)

    def _curve(self, curve: RDPCurve) -> np.ndarray:
        cached = self._curve_cache.get(curve)
        if cached is None:
            cached = self._curve_cache[curve] = curve(self.orders)
        return cached

    def _stream_totals(self, charges: Iterable[Charge], with_rdp: bool = True) -> _Totals:
        cs = list(charges)
        t = _Totals(
            eps=math.fsum(c.epsilon for c in cs),
            delta=math.fsum(c.delta for c in cs),
            sum_sq=math.fsum(c.epsilon**2 for c in cs),
            sum_drift=math.fsum(c.epsilon * math.expm1(c.epsilon) for c in cs),
            rdp=np.zeros(self.orders.size),
        )
        if not with_rdp:
            return t
        for c in cs:
            if c.rdp is not None:
                t.rdp = t.rdp + self._curve(c.rdp)
            elif c.delta == 0:
                t.rdp = t.rdp + self._curve(rdp_pure(c.epsilon))
            else:
                t.extra_eps += c.epsilon
                t.extra_delta += c.delta
        return t

    def _unit_totals(
        self, stream: str | None = None, extra: Charge | None = None, with_rdp: bool = True
    ) -> _Totals:
        charges = self._charges if extra is None else [*self._charges, extra]
        if stream is not None:
            return self._stream_totals((c for c in charges if c.stream == stream), with_rdp)
        by_stream: dict[str, list[Charge]] = {}
        for c in charges:
            by_stream.setdefault(c.stream, []).append(c)
        grouped = {s for members in self._groups.values() for s in members}
        units = [self._stream_totals(cs, with_rdp) for s, cs in by_stream.items() if s not in grouped]
        for members in self._groups.values():
            parts = [self._stream_totals(by_stream[s], with_rdp) for s in members if s in by_stream]
            if parts:
                units.append(_Totals.worst(parts, self.orders.size))
        return _Totals.total(units, self.orders.size)

    def basic(self, stream: str | None = None) -> tuple[float, float]:
        """Sequential composition (Σε, Σδ); disjoint groups count their worst stream."""
        t = self._unit_totals(stream, with_rdp=False)
        return t.eps, t.delta

    def advanced(self, delta_prime: float, stream: str | None = None) -> tuple[float, float]:
        """Advanced composition: ``(√(2 ln(1/δ')Σε²) + Σε(e^ε-1), Σδ + δ')``."""
        delta_prime = check_delta(delta_prime, "delta_prime")
        t = self._unit_totals(stream, with_rdp=False)
        return _advanced_from_sums(t.sum_sq, t.sum_drift, delta_prime), t.delta + delta_prime

    def rdp_curve(self, stream: str | None = None) -> np.ndarray:
        """The composed RDP curve over :attr:`orders` (charges with δ > 0 and no curve are not in it)."""
        return self._unit_totals(stream).rdp

    def rdp(self, delta: float, stream: str | None = None) -> tuple[float, float, float]:
        """RDP composition converted at δ: returns (ε, total δ, the minimising α)."""
        delta = check_delta(delta)
        t = self._unit_totals(stream)
        if not np.any(t.rdp):
            return t.extra_eps, t.extra_delta, float("nan")
        eps, order = rdp_to_dp(t.rdp, self.orders, delta)
        return eps + t.extra_eps, delta + t.extra_delta, order

    def report(self, delta: float, stream: str | None = None) -> SpendReport:
        """All three compositions at target δ (used by advanced composition as δ' and by the RDP conversion)."""
        delta = check_delta(delta)
        rdp_eps, rdp_delta, order = self.rdp(delta, stream)
        n = len(self._charges) if stream is None else sum(c.stream == stream for c in self._charges)
        return SpendReport(n, self.basic(stream), self.advanced(delta, stream), (rdp_eps, rdp_delta), order, delta)

    # ------------------------------------------------------------ state
    def to_state(self) -> dict[str, Any]:
        return {
            "version": 1,
            "orders": self.orders.tolist(),
            "total_cap": self.total_cap,
            "delta_cap": self.delta_cap,
            "caps": dict(self._caps),
            "groups": {g: list(m) for g, m in self._groups.items()},
            "charges": [c.to_state() for c in self._charges],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Accountant:
        if state.get("version") != 1:
            raise ValueError(f"unsupported accountant state version {state.get('version')!r}")
        try:
            acc = cls(state["orders"], state.get("total_cap"), state.get("delta_cap"))
            for group, members in state.get("groups", {}).items():
                acc.declare_disjoint(group, members)
            for stream, cap in state.get("caps", {}).items():
                acc.set_cap(stream, cap)
            for raw in state["charges"]:
                c = Charge.from_state(raw)
                acc._charges.append(c)  # already admitted when first recorded: no cap re-check
                if c.memo_key is not None:
                    acc._memo.setdefault(c.stream, set()).add(c.memo_key)
        except KeyError as exc:
            raise ValueError(f"accountant state is missing {exc}") from None
        return acc


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value
