"""DDRM — continual frequency estimation of a binary stream with a difference tree (Xue et al., "DDRM: a continual
frequency estimation mechanism with local differential privacy", IEEE TKDE 2022; thesis §3-2-3), SPEC §3.12.

Each device holds x_t ∈ {0, 1} for t = 1..T (x_0 = 0). Over the time axis sits a dyadic tree: the node at level
j with index i covers ((i-1)·2^j, i·2^j] and its value is the difference x_{i·2^j} - x_{(i-1)·2^j} ∈ {-1, 0, 1};
it is released at time i·2^j (levels 0..⌊log2 T⌋, fewer than 2T nodes). The device reports every node:

* zero difference: r = ±1 with probability 1/2 each (independent of everything: no budget);
* non-zero v ∈ {-1, 1}: r = +1 w.p. 1/2 + (v/2)(e^ε-1)/(e^ε+1) — ε-LDP against the other sign; against a zero
  difference the ratio is 2e^ε/(e^ε+1) one way and (e^ε+1)/2 the other (their product is e^ε);
* at most ``max_nonzero`` non-zero nodes per device: later non-zero nodes are reported as zeros (fair coins), a
  documented bias that only devices changing more than the declared number of times incur. One change of x makes
  every node whose interval straddles it non-zero — up to ⌊log2 T⌋+1 nodes — so choose
  max_nonzero ≥ (changes allowed)·(⌊log2 T⌋+1) (:meth:`DDRM.for_changes`; x_0 = 0, so starting at 1 is a change).

Reports are independent across nodes given the stream, so the exact worst case of ln P[transcript | a]/P[· | b]
is Σ_nodes c(v_a, v_b) with c = ε for opposite non-zero values, c1 = ln(2e^ε/(e^ε+1)) when only v_a is non-zero,
c0 = ln((e^ε+1)/2) when only v_b is, 0 when equal. Since c0 + c1 = ε, with A, B the non-zero nodes,
c1|A∖B| + c0|B∖A| + ε|opposite| ≤ c1|A| + c0|B| ≤ ε·max(|A|, |B|): the loss is at most max(charged(a), charged(b))
when a device is charged ε per non-zero node it reports, and at most max_nonzero·ε overall.

Server: E[r | v] = v/c with c = (e^ε+1)/(e^ε-1), so c·mean(r) is unbiased for a node's mean difference, and the
fraction of ones at time t is the sum over the dyadic decomposition of (0, t] (the set bits of t) — at most
⌊log2 t⌋+1 nodes, per-user variance Σ_nodes (c² - E[v²]) ≤ popcount(t)·c².

Interface. A difference tree has no memo slots, no permanent randomized response and no secret: every node is
randomized afresh from the device's rng. So :class:`DDRM` and :class:`CategoricalDDRM` derive from the common
:class:`~protocols.longitudinal.base.LongitudinalProtocol` (not the memoized layer) and their clients from
:class:`~protocols.longitudinal.base.LongitudinalClient`: they have no ``n_slots``, ``memo_slots``, ``_charge``,
``_slot``, ``_draw_prr``, ``_irr``, ``secret`` or ``memo``, and everything they expose works
(``tests/protocols/longitudinal/test_ddrm.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.accounting import memo_slots_bound
from protocols.base import check_epsilon, check_int
from protocols.longitudinal.base import FleetState, LongitudinalClient, LongitudinalProtocol
from protocols.longitudinal.memo import LongitudinalReport

__all__ = ["DDRM", "DDRMClient", "CategoricalDDRM", "CategoricalDDRMClient"]


def _tree_client(protocol: LongitudinalProtocol, stream: str, rng: np.random.Generator | None,
                 secret: object) -> LongitudinalClient:
    del secret  # a tree keeps no secret (see the protocols' ``client``)
    return protocol.client_class(protocol, stream=stream, rng=rng)


class DDRM(LongitudinalProtocol):
    """DDRM over horizon T with per-node budget ε and at most ``max_nonzero`` non-zero reports per device.

    ``estimate_round`` decodes the latest time from *every* round's reports so far (a round's nodes alone do not
    cover (0, t]); :meth:`simulate_rounds` therefore keeps the rounds' reports and decodes their concatenation.
    """

    name = "DDRM"
    _keeps_history = True

    def __init__(self, epsilon: float, horizon: int, max_nonzero: int) -> None:
        self.epsilon_inf = self.epsilon_1 = check_epsilon(epsilon)
        self.horizon = check_int(horizon, "horizon", 1)
        self.max_nonzero = check_int(max_nonzero, "max_nonzero", 1)
        self.levels = self.horizon.bit_length()  # levels 0 .. levels-1 (2^(levels-1) <= T)
        ends, levels = [], []
        for t in range(1, self.horizon + 1):
            for j in range(self.levels):
                if t % (1 << j) == 0:
                    ends.append(t)
                    levels.append(j)
        self.node_end = np.asarray(ends, dtype=np.int64)
        self.node_level = np.asarray(levels, dtype=np.int64)
        self.node_start = self.node_end - (1 << self.node_level)
        self._index = {(int(j), int(e)): i for i, (j, e) in enumerate(zip(self.node_level, self.node_end))}
        self.released_by = np.searchsorted(self.node_end, np.arange(self.horizon + 1), side="right")
        e = math.exp(self.epsilon_inf)
        self.c = (e + 1) / (e - 1)
        self.cost_nonzero_vs_zero = math.log(2 * e / (e + 1))
        self.cost_zero_vs_nonzero = math.log((e + 1) / 2)

    @classmethod
    def for_changes(cls, epsilon: float, horizon: int, changes: int) -> DDRM:
        """DDRM that never truncates a stream with at most ``changes`` value changes: max_nonzero = changes·levels.

        x_0 = 0, so a stream that starts at 1 counts its first value as a change.
        """
        levels = check_int(horizon, "horizon", 1).bit_length()
        return cls(epsilon, horizon, check_int(changes, "changes", 1) * levels)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon_inf, "horizon": self.horizon, "max_nonzero": self.max_nonzero}

    @property
    def n_nodes(self) -> int:
        return int(self.node_end.size)

    @property
    def irr_input_epsilon(self) -> float:
        """ε of one node's randomized response against the opposite non-zero difference."""
        return self.epsilon_inf

    def client(self, *, stream: str = "default", rng: np.random.Generator | None = None,
               secret: object = None) -> DDRMClient:
        """A device's tree client. ``secret`` is accepted and unused — a tree memoizes nothing and draws every bit
        from ``rng`` — so that callers creating clients of any protocol alike need not special-case trees."""
        return _tree_client(self, stream, rng, secret)  # type: ignore[return-value]

    def _slots(self, reports: int) -> int:
        """The most non-zero nodes a stream of ``reports`` reports can release: min(max_nonzero, nodes released)."""
        return min(self.max_nonzero, int(self.released_by[reports]))

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """The most one tree can charge, ``device_epsilon(horizon)`` = ε·min(max_nonzero, nodes) (``n_distinct``, if
        given, caps the number of non-zero nodes instead): each non-zero node is a slot charged once
        (:func:`protocols.accounting.memo_slots_bound`)."""
        return memo_slots_bound(self.epsilon_inf, self._slots(self.horizon), n_distinct)

    def _check_stream(self, values: Any, time_axis: bool = True) -> np.ndarray:
        arr = np.asarray(values)
        if arr.size and not np.all((arr == 0) | (arr == 1)):
            raise ValueError("DDRM streams are binary (0/1)")
        if time_axis and (arr.ndim == 0 or arr.shape[-1] > self.horizon):
            raise ValueError(f"streams are longer than the horizon T={self.horizon}")
        return arr.astype(np.int64)

    def node_values(self, streams: Any) -> np.ndarray:
        """Effective node values (…, nodes released by len(stream)) after the max_nonzero truncation."""
        x = self._check_stream(streams)
        t = x.shape[-1]
        padded = np.concatenate([np.zeros(x.shape[:-1] + (1,), dtype=np.int64), x], axis=-1)
        m = int(self.released_by[t])
        v = padded[..., self.node_end[:m]] - padded[..., self.node_start[:m]]
        allowed = np.cumsum(v != 0, axis=-1) <= self.max_nonzero
        return np.where(allowed, v, 0)

    def device_epsilon(self, reports: int) -> float:
        """The exact worst case over *all* pairs of streams of length ``reports``: ε · min(max_nonzero, nodes
        released by then). Any stream reports at most that many non-zero nodes, and the loss of a pair is at most
        ε·max(|A|, |B|) (module docstring); two streams whose non-zero nodes coincide with opposite signs attain it.
        It depends on the number of changes allowed, not on the number of reports once the tree is large enough."""
        return memo_slots_bound(self.epsilon_inf, self._slots(check_int(reports, "reports", 0, self.horizon)))

    def charged_total(self, values: Any, **device: Any) -> float:
        """ε per non-zero node reported (after truncation)."""
        return self.epsilon_inf * int(np.count_nonzero(self.node_values(np.asarray(values).ravel())))

    def transcript_epsilon_bound(self, values_a: Any, values_b: Any, **device: Any) -> float:
        """Exact worst-case log-likelihood ratio between the transcripts of two streams (module docstring)."""
        a, b = np.asarray(values_a).ravel(), np.asarray(values_b).ravel()
        if a.shape != b.shape or a.size == 0:
            raise ValueError("both streams must be non-empty and of equal length")
        return self.pair_loss(self.node_values(a), self.node_values(b))

    def pair_loss(self, va: np.ndarray, vb: np.ndarray) -> float:
        """The exact worst-case log-likelihood ratio between the reports of two effective node-value arrays (same
        shape): Σ c(v_a, v_b) in the direction that is larger (module docstring)."""
        opposite = int(np.count_nonzero((va * vb) < 0))
        only_a = int(np.count_nonzero((va != 0) & (vb == 0)))
        only_b = int(np.count_nonzero((va == 0) & (vb != 0)))
        c1, c0 = self.cost_nonzero_vs_zero, self.cost_zero_vs_nonzero
        directions = (c1 * only_a + c0 * only_b, c0 * only_a + c1 * only_b)
        return float(self.epsilon_inf * opposite + max(directions))

    def _report_bits(self, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        prob = 0.5 + 0.5 * v / self.c
        return np.where(rng.random(v.shape) < prob, 1, -1).astype(np.int8)

    def privatize_stream(self, streams: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """All nodes at once for streams (n, t): reports (n, nodes released by t) in ±1, charges (n, t)."""
        x = self._check_stream(streams)
        if x.ndim != 2:
            raise ValueError("streams must have shape (n, t)")
        v = self.node_values(x)
        reports = self._report_bits(v, rng)
        charges = np.zeros(x.shape, dtype=float)
        ends = self.node_end[: v.shape[1]] - 1
        np.add.at(charges.T, ends, (v != 0).T * self.epsilon_inf)
        return reports, charges

    # per-round fleet simulation -------------------------------------------------------------------------------
    def new_fleet(self, n: int, rng: np.random.Generator, **fixed: Any) -> FleetState:
        if fixed:
            raise ValueError(f"DDRM has no per-device parameters to fix, got {sorted(fixed)}")
        n = check_int(n, "n", 1)
        fleet = FleetState(keys=np.zeros(n, dtype=np.uint64), seen=np.zeros((n, 0), dtype=bool), spent=np.zeros(n))
        fleet.aux["last"] = np.zeros((n, self.levels), dtype=np.int64)
        fleet.aux["used"] = np.zeros(n, dtype=np.int64)
        return fleet

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reports (n, number of nodes released at this time) in ±1, ordered by level; charges (n,)."""
        x = self._check_stream(values, time_axis=False)
        if x.shape != (fleet.n,):
            raise ValueError(f"expected one bit per device, shape ({fleet.n},), got {x.shape}")
        t = fleet.rounds + 1
        if t > self.horizon:
            raise ValueError(f"horizon T={self.horizon} exhausted")
        levels = [j for j in range(self.levels) if t % (1 << j) == 0]
        last, used = fleet.aux["last"], fleet.aux["used"]
        cols = []
        for j in levels:  # at most log2(T)+1 levels: a loop over tree levels, vectorised over devices
            v = x - last[:, j]
            nonzero = v != 0
            allowed = nonzero & (used < self.max_nonzero)
            used += allowed
            cols.append(np.where(allowed, v, 0))
            last[:, j] = x
        v_eff = np.stack(cols, axis=1)
        charges = np.count_nonzero(v_eff, axis=1) * self.epsilon_inf
        fleet.spent += charges
        fleet.rounds = t
        return self._report_bits(v_eff, rng), charges

    def estimate(self, reports: Any) -> np.ndarray:
        """Fractions of ones at t = 1..t_max from reports (n, nodes released by t_max) (concatenated rounds)."""
        r = np.asarray(reports, dtype=float)
        if r.ndim != 2 or r.shape[0] == 0:
            raise ValueError("reports must have shape (n, nodes) with n >= 1")
        m = r.shape[1]
        t_max = int(np.searchsorted(self.released_by, m, side="right")) - 1
        if t_max < 1 or self.released_by[t_max] != m:
            raise ValueError(f"{m} node columns do not match the nodes released by any time 1..{self.horizon}")
        node_mean = self.c * r.mean(axis=0)
        out = np.zeros(t_max)
        for t in range(1, t_max + 1):
            out[t - 1] = node_mean[self.prefix_nodes(t)].sum()
        return out

    def prefix_nodes(self, t: int) -> list[int]:
        """Indices of the nodes whose intervals partition (0, t] (one per set bit of t)."""
        t = check_int(t, "t", 1, self.horizon)
        out, start = [], 0
        for j in range(self.levels - 1, -1, -1):
            if t & (1 << j):
                out.append(self._index[(j, start + (1 << j))])
                start += 1 << j
        return out

    def estimate_round(self, reports: Any) -> float:
        """Fraction of ones at the latest time covered by ``reports`` (all rounds so far, concatenated)."""
        return float(self.estimate(reports)[-1])

    def variance(self, t: int, node_sq_means: Any = None) -> float:
        """Per-user variance of the estimate at time t: Σ_nodes (c² - E[v²]) (upper bound popcount(t)·c²)."""
        nodes = self.prefix_nodes(t)
        if node_sq_means is None:
            return len(nodes) * self.c**2
        sq = np.asarray(node_sq_means, dtype=float)
        return float(np.sum(self.c**2 - sq[nodes]))

    def _estimate_history(self, history: list[Any]) -> float:
        """The fraction of ones at the latest round, from every round's reports (concatenated)."""
        return self.estimate_round(np.concatenate(history, axis=1))


class DDRMClient(LongitudinalClient):
    """Device side of DDRM: ``report(bit)`` returns the ±1 reports (int8 array) of the nodes released now.

    The charge is ε per non-zero node reported; there is no memo (``memo_key`` is None). State: time, the stream
    value at the last boundary of every level, non-zero reports used.
    """

    protocol: DDRM

    def __init__(self, protocol: DDRM, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        self.t = 0
        self.last = [0] * protocol.levels
        self.used = 0

    @property
    def spent(self) -> float:
        """ε per non-zero node reported so far."""
        return self.protocol.epsilon_inf * self.used

    def report(self, value: Any) -> LongitudinalReport:
        """The ±1 reports of the nodes released at the next time step, charged ε per non-zero node."""
        if isinstance(value, bool) or value not in (0, 1):
            raise ValueError(f"DDRM reports bits (0 or 1), got {value!r}")
        x = int(value)
        if self.t >= self.protocol.horizon:
            raise ValueError(f"horizon T={self.protocol.horizon} exhausted")
        self.t += 1
        values = []
        for j in range(self.protocol.levels):
            if self.t % (1 << j):
                continue
            v = x - self.last[j]
            if v != 0 and self.used < self.protocol.max_nonzero:
                self.used += 1
            else:
                v = 0
            values.append(v)
            self.last[j] = x
        v_arr = np.asarray(values, dtype=np.int64)
        charge = self.protocol.epsilon_inf * int(np.count_nonzero(v_arr))
        return LongitudinalReport(self.protocol._report_bits(v_arr, self.rng), charge, None, charge > 0)

    def _device_state(self) -> dict[str, Any]:
        return {"t": self.t, "last": list(self.last), "used": self.used}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"t", "last", "used"}:
            raise ValueError("DDRM device state must contain 't', 'last' and 'used'")
        last = [int(v) for v in state["last"]]
        if len(last) != self.protocol.levels or any(v not in (0, 1) for v in last):
            raise ValueError("DDRM state 'last' must hold one bit per tree level")
        self.t = check_int(state["t"], "t", 0, self.protocol.horizon)
        self.used = check_int(state["used"], "used", 0, self.protocol.max_nonzero)
        self.last = last


DDRM.client_class = DDRMClient


class CategoricalDDRM(LongitudinalProtocol):
    """Change-bounded continual reporting of a categorical value in [0, k): one DDRM difference tree per category
    indicator 1[x_t = v] over a horizon of T reports, with ONE budget of ``max_nonzero`` non-zero nodes shared by all
    k trees: M = (2·changes + 1)·levels (a change moves two indicators; the first value, from x_0 = none, one).

    **Privacy (device unit, exact).** Every (node, indicator) is reported independently: a fair ±1 coin for a zero
    difference, DDRM's ε-randomized response of ±1 otherwise; any stream has at most M non-zero pairs. By the
    argument in the module docstring the loss of the whole tree's transcript between *any* two streams is at most
    ε·max(|A|, |B|) ≤ ε·min(M, k·R(t)) after t reports (R(t) = nodes released per tree by time t), whatever the
    number of reports: :meth:`device_epsilon`, charged incrementally by :meth:`step_charge` (data-independent). A
    stream with more changes than declared is not less private — its later changes are reported as no change (a
    documented bias of the estimate, never a larger loss).

    **Report** at step t: ``[t, s_1, …, s_k]`` with s = Σ_{j ∈ bits(t)} b_j, the ±1 bits of the latest node of each
    level in the dyadic decomposition of (0, t] — a function of bits already released (the new node included), so
    re-sending prefix sums costs nothing. E[c·s_v] = 1[x_t = v] (telescoping), c = (e^ε+1)/(e^ε-1), so one round's
    reports alone decode: f̂ = c·mean(s). Per-user variance c²·popcount(t) − f ≤ c²·levels − f (:meth:`variance`
    uses the bound). Xue et al., TKDE 2022 (DDRM); the change-bounded accounting follows Joseph, Roth, Ullman and
    Waggoner, NeurIPS 2018 ("Local differential privacy for evolving data"): cost grows with changes, not rounds.
    """

    name = "DDRM-k"

    def __init__(self, epsilon_inf: float, k: int, horizon: int, changes: int,
                 epsilon_1: float | None = None) -> None:
        eps = check_epsilon(epsilon_inf)
        if epsilon_1 is not None and not math.isclose(float(epsilon_1), eps, rel_tol=1e-12):
            raise ValueError("DDRM has one ε per node: epsilon_1 must equal epsilon_inf")
        self.epsilon_inf = self.epsilon_1 = eps
        self.k = check_int(k, "k", 2, 1024)
        self.horizon = check_int(horizon, "horizon", 1, 1 << 20)
        self.changes = check_int(changes, "changes", 0, 1 << 20)
        self.tree = DDRM(eps, self.horizon, 1)  # the node geometry (ends, levels, released_by)
        self.levels = self.tree.levels
        self.max_nonzero = (2 * self.changes + 1) * self.levels
        self.c = self.tree.c

    def params(self) -> dict[str, Any]:
        return {"epsilon_inf": self.epsilon_inf, "epsilon_1": self.epsilon_1, "k": self.k, "horizon": self.horizon,
                "changes": self.changes}

    @property
    def irr_input_epsilon(self) -> float:
        """ε of one (node, indicator) randomized response against the opposite non-zero difference."""
        return self.epsilon_inf

    def client(self, *, stream: str = "default", rng: np.random.Generator | None = None,
               secret: object = None) -> CategoricalDDRMClient:
        """A device's tree client. ``secret`` is accepted and unused — a tree memoizes nothing and draws every bit
        from ``rng`` — so that callers creating clients of any protocol alike need not special-case trees."""
        return _tree_client(self, stream, rng, secret)  # type: ignore[return-value]

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """The most one tree can charge, ``device_epsilon(horizon)`` = ε·min(M, k·R(T)) (``n_distinct``, if given,
        caps the number of non-zero (node, indicator) pairs instead)."""
        return memo_slots_bound(self.epsilon_inf, self._slots(self.horizon), n_distinct)

    def transcript_epsilon_bound(self, values_a: Any, values_b: Any, **device: Any) -> float:
        """The worst-case log-likelihood ratio between the (node, indicator) bits of two streams — exact for the
        bits, an upper bound for the reports (prefix sums of released bits, a post-processing)."""
        a, b = self._check_values(values_a).ravel(), self._check_values(values_b).ravel()
        if a.shape != b.shape or a.size == 0:
            raise ValueError("both streams must be non-empty and of equal length")
        if a.size > self.horizon:
            raise ValueError(f"streams are longer than the horizon T={self.horizon}")
        return self.tree.pair_loss(self.node_values(a), self.node_values(b))

    def device_epsilon(self, reports: int) -> float:
        """ε · min(M, k·R(reports)): the exact worst case over any two streams (class docstring)."""
        return memo_slots_bound(self.epsilon_inf, self._slots(check_int(reports, "reports", 0, self.horizon)))

    def _slots(self, reports: int) -> int:
        """The most non-zero (node, indicator) pairs ``reports`` reports can release: min(M, k·R(reports))."""
        return min(self.max_nonzero, self.k * int(self.tree.released_by[reports]))

    def step_charge(self, t: int) -> float:
        """What report t (1-based) of a tree adds to :meth:`device_epsilon` (0 once the change budget is covered)."""
        t = check_int(t, "t", 1, self.horizon)
        return self.device_epsilon(t) - self.device_epsilon(t - 1)

    def charged_total(self, values: Any, **device: Any) -> float:
        """What the ledger charges for reporting ``values`` (data-independent): ``device_epsilon(len(values))``."""
        return self.device_epsilon(len(np.asarray(values).ravel()))

    def step(self, last: list[int], used: int, x: int, t: int) -> tuple[list[tuple[int, np.ndarray]], int]:
        """Step t of a tree for value x: the effective difference vector of every level released at t (after the
        shared budget) and the new count of non-zero pairs used; ``last`` (the value at each level's last
        boundary, −1: none) is updated in place. The one rule both the device and :meth:`node_values` follow."""
        out = []
        for j in range(self.levels):
            if t % (1 << j):
                continue
            diff = np.zeros(self.k, dtype=np.int64)
            diff[x] += 1
            if last[j] >= 0:
                diff[last[j]] -= 1
            for u in np.flatnonzero(diff):
                if used < self.max_nonzero:
                    used += 1
                else:
                    diff[u] = 0
            out.append((j, diff))
            last[j] = x
        return out, used

    def node_values(self, values: Any) -> np.ndarray:
        """The effective (node, indicator) differences a stream of values reports, in release order, after the
        shared budget: shape (nodes released by len(values), k), entries in {-1, 0, 1}."""
        last, used, rows = [-1] * self.levels, 0, []
        for t, v in enumerate(self._check_values(values).ravel().tolist(), start=1):
            diffs, used = self.step(last, used, v, t)
            rows += [d for _, d in diffs]
        return np.asarray(rows, dtype=np.int64).reshape(-1, self.k)

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance bound of f̂_v: c²·levels − f (popcount(t) ≤ levels)."""
        out = self.c**2 * self.levels - np.asarray(f, dtype=float)
        return float(out) if out.ndim == 0 else out

    def _check_values(self, values: Any) -> np.ndarray:
        arr = np.asarray(values)
        if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= self.k):
            raise ValueError(f"values must be integers in [0, {self.k})")
        return arr.astype(np.int64)

    def estimate_round(self, reports: Any) -> np.ndarray:
        """f̂ = c·mean(s) from one round's rows ``[t, s_1..s_k]`` (each row decodes alone)."""
        return self.estimate_counts(self.round_counts(reports), np.asarray(reports).shape[0])

    def estimate_counts(self, counts: Any, n: int) -> np.ndarray:
        """f̂ = c·Σs/n from the round's sums Σs (:meth:`round_counts`) of n reports."""
        if n <= 0:
            raise ValueError("cannot estimate frequencies from zero reports")
        return self.c * np.asarray(counts, dtype=float) / n

    def round_counts(self, reports: Any) -> np.ndarray:
        """Sufficient statistics of a round: Σ s over its rows ``[t, s_1..s_k]`` (after the support checks)."""
        r = np.asarray(reports)
        if r.ndim != 2 or r.shape[1] != self.k + 1 or r.shape[0] == 0 or r.dtype.kind not in "iu":
            raise ValueError(f"DDRM-k reports are integer rows [t, s_1..s_{self.k}]")
        t, s = r[:, 0].astype(np.int64), r[:, 1:].astype(np.int64)
        if np.any(t < 1) or np.any(t > self.horizon):
            raise ValueError(f"the step t must lie in [1, {self.horizon}]")
        mm = sum((t >> j) & 1 for j in range(self.levels))[:, None]  # popcount(t): a loop over levels only
        if np.any(np.abs(s) > mm) or np.any((s - mm) % 2):
            raise ValueError("a prefix sum outside the support of the step's ±1 bits")
        return s.sum(axis=0)

    def privatize_round(self, values: Any, fleet: FleetState, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n devices at once (one tree step; the tree starts at fleet.rounds = 0): reports (n, k+1), charges (n,)."""
        x = self._check_fleet_values(values, fleet)
        t = fleet.rounds + 1
        if t > self.horizon:
            raise ValueError(f"horizon T={self.horizon} exhausted")
        n, k = fleet.n, self.k
        last, used, noisy = fleet.aux["last"], fleet.aux["used"], fleet.aux["noisy"]
        onehot = np.zeros((n, k), dtype=np.int64)
        onehot[np.arange(n), x] = 1
        for j in range(self.levels):  # a loop over tree levels and categories, vectorised over devices
            if t % (1 << j):
                continue
            prev = np.zeros((n, k), dtype=np.int64)
            have = last[:, j] >= 0
            prev[np.flatnonzero(have), last[have, j]] = 1
            diff = onehot - prev
            for v in range(k):
                allowed = (diff[:, v] != 0) & (used < self.max_nonzero)
                used += allowed
                diff[:, v] = np.where(allowed, diff[:, v], 0)
            noisy[:, j, :] = self.tree._report_bits(diff, rng)
            last[:, j] = x
        bits = [j for j in range(self.levels) if t & (1 << j)]
        s = noisy[:, bits, :].astype(np.int64).sum(axis=1)
        fleet.rounds = t
        charge = np.full(n, self.step_charge(t))
        fleet.spent += charge
        return np.concatenate([np.full((n, 1), t, dtype=np.int64), s], axis=1), charge

    def new_fleet(self, n: int, rng: np.random.Generator, **fixed: Any) -> FleetState:
        if fixed:
            raise ValueError(f"DDRM-k has no per-device parameters to fix, got {sorted(fixed)}")
        n = check_int(n, "n", 1)
        fleet = FleetState(keys=np.zeros(n, dtype=np.uint64), seen=np.zeros((n, 0), dtype=bool), spent=np.zeros(n))
        fleet.aux["last"] = np.full((n, self.levels), -1, dtype=np.int64)
        fleet.aux["used"] = np.zeros(n, dtype=np.int64)
        fleet.aux["noisy"] = np.ones((n, self.levels, self.k), dtype=np.int8)
        return fleet


class CategoricalDDRMClient(LongitudinalClient):
    """Device side of :class:`CategoricalDDRM`: ``report(value)`` → ``[t, s_1..s_k]`` and the step's charge.

    State (``to_state()["device"]``): the step t, the value at the last boundary of every level (−1: none yet —
    the device keeps these categories to form differences; they never leave it), the non-zero pairs used, and the
    ±1 bits of the latest node of every level (already released). There is no memo."""

    protocol: CategoricalDDRM

    def __init__(self, protocol: CategoricalDDRM, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        self.t, self.used = 0, 0
        self.last = [-1] * protocol.levels
        self.noisy = [[1] * protocol.k for _ in range(protocol.levels)]

    @property
    def complete(self) -> bool:
        """Whether the tree has reported its whole horizon (the next report needs a new tree)."""
        return self.t >= self.protocol.horizon

    @property
    def spent(self) -> float:
        """ε charged so far: the sum of the step charges, ``device_epsilon(t)``."""
        return self.protocol.device_epsilon(self.t)

    def report(self, value: Any) -> LongitudinalReport:
        """``[t, s_1..s_k]`` for the next step and the step's (data-independent) charge."""
        p = self.protocol
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < p.k:
            raise ValueError(f"DDRM-k reports a category in [0, {p.k}), got {value!r}")
        if self.complete:
            raise ValueError(f"horizon T={p.horizon} exhausted: start a new tree")
        self.t += 1
        diffs, self.used = p.step(self.last, self.used, int(value), self.t)
        for j, diff in diffs:
            self.noisy[j] = [int(b) for b in p.tree._report_bits(diff, self.rng)]
        s = np.sum([self.noisy[j] for j in range(p.levels) if self.t & (1 << j)], axis=0).astype(np.int64)
        charge = p.step_charge(self.t)
        return LongitudinalReport(np.concatenate([[self.t], s]).astype(np.int64), charge, None, charge > 0)

    def _device_state(self) -> dict[str, Any]:
        return {"t": self.t, "last": list(self.last), "used": self.used, "noisy": [list(b) for b in self.noisy]}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"t", "last", "used", "noisy"}:
            raise ValueError("DDRM-k device state must contain 't', 'last', 'used' and 'noisy'")
        p = self.protocol
        self.t = check_int(state["t"], "t", 0, p.horizon)
        self.used = check_int(state["used"], "used", 0, p.max_nonzero)
        last = [int(v) for v in state["last"]]
        noisy = [[int(b) for b in row] for row in state["noisy"]]
        if len(last) != p.levels or any(not -1 <= v < p.k for v in last):
            raise ValueError("DDRM-k state 'last' must hold one category (or -1) per level")
        if len(noisy) != p.levels or any(len(r) != p.k or any(b not in (-1, 1) for b in r) for r in noisy):
            raise ValueError("DDRM-k state 'noisy' must hold k ±1 bits per level")
        self.last, self.noisy = last, noisy


CategoricalDDRM.client_class = CategoricalDDRMClient
