"""Hierarchical intervals (HI) with user-level sampling of one tree level.

Cormode, Kulkarni, Srivastava, "Answering range queries under local differential privacy", PVLDB 12(10), 2019
(their "HH" / hierarchical-histogram method), with the consistency step of Hay, Rastogi, Miklau, Suciu,
"Boosting the accuracy of differentially private histograms through consistency", PVLDB 3(1), 2010.

**Tree.** A B-ary tree over the D buckets, padded to ``B^h`` leaves with ``h = ⌈log_B D⌉`` (no padding when D
is a power of B; padded leaves hold nobody). Level l (l = 0 root … h leaves) has ``B^l`` nodes; bucket v lies in
node ``v // B^{h-l}`` at level l. The root's fraction is 1, known without asking anyone.

**Client.** Sample a level l uniformly from {1, …, h} (independently of the value) and report the node holding
the value at that level with a frequency oracle over ``B^l`` items at the *full* ε (OUE or OLH; users are split
between levels, not the budget). Report row: OUE — uint8 ``[l, bits…]`` of width ``1 + B^h`` (bits beyond
``B^l`` are 0); OLH — int64 ``[l, seed, y]``.

**Privacy (exact).** ``P[(l, r) | v] = (1/h)·P_oracle,l[r | node_l(v)]``: the level's probability does not
depend on v, so every likelihood ratio is an oracle's at ε — exactly ε-LDP (:meth:`HierarchicalIntervals.likelihood`).

**Per-level estimates.** With n_l users at level l and the oracle's support counts C, ``f̂_l = (C/n_l − q)/(p − q)``
— unbiased given n_l ≥ 1 (the n_l users are a uniformly random subset of the population).

**Range queries.** [a, b] is split into its minimal B-adic decomposition (at most 2(B−1) nodes per level,
peeled from the leaves up; the whole domain is the root). The raw range estimate is the sum of the nodes'
estimates: unbiased. With S_l the decomposition's nodes at level l (m_l nodes holding a fraction f_l of users,
Σ_l f_l = f), a first-order (delta-method, n_l ≈ n/h) per-user variance, fixed population, is

    Var = h · Σ_l [ V_l + f_l(1 − f_l) ] − f(1 − f),   V_l = (f_l·p(1−p) + (m_l − f_l)·q(1−q)) / (p − q)²,

V_l being the oracle's variance of a sum of m_l items (:func:`~protocols.distribution.flat.oracle_range_variance`;
exact for OUE, idealised for OLH when m_l ≥ 2) and f_l(1−f_l) the sampling error of estimating level l from a
random n/h users. At f = 0 this is the paper's ``h·Σ_l m_l·V_F``. When only f is given, it is split across the
levels in proportion to the pieces' lengths (values spread evenly within the range).

**Consistency** (``consistency=True``, the default): Hay et al.'s constrained inference on the tree — bottom-up
weighted averaging ``z_v = ((B^i − B^{i−1})/(B^i − 1))·x̃_v + ((B^{i−1} − 1)/(B^i − 1))·Σ_children z_c`` at height i
(leaves i = 1), then top-down mean consistency ``x̄_v = z_v + (x̄_parent − Σ_siblings z)/B`` from the exact root
x̄ = 1. Both passes are linear and preserve expectations, so the consistent estimates stay unbiased; every node
then equals the sum of its children, so a range is the sum of its leaves. Hay et al.'s least-squares optimality
assumes equal node variances, which holds here only approximately (it is exact at f = 0 within a level).

**Variance of the consistent estimate.** Consistency is linear, so a leaf query Σ w·x̄ equals Σ_l u_l·x̃_l plus a
constant, the raw node weights u_l given by the adjoint of the two passes (:meth:`HierarchicalIntervals.
_consistency_adjoint`). Its first-order per-user variance, for a population with bucket fractions f, is

    Var = h · Σ_l [ Σ_i u_{l,i}² V_{l,i} + Var_v u_l[node_l(v)] ] − Var_v Σ_l u_l[node_l(v)]

(:meth:`HierarchicalIntervals.query_variances`; with a decomposition's indicator weights it is the raw formula
above). ``range_variance`` is this variance when ``consistency`` (the population spread evenly inside and outside
the range; ``raw_range_variance`` keeps the raw one), and the CDF intervals use it at the plug-in histogram. It is
below the raw formula, the more so the longer the range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols import catalogue
from protocols.base import check_epsilon, check_int
from protocols.distribution.base import AnalyticDistribution, check_range
from protocols.distribution.flat import check_oracle, make_oracle, oracle_range_variance
from protocols.distribution.grid import MAX_BUCKETS

__all__ = ["HierarchicalIntervals", "tree_height", "decompose"]

#: Largest grid whose CDF intervals use the consistent estimate's exact variance (its cost grows as O(D·B^h);
#: ``make eval``'s distribution section times the server).
EXACT_VARIANCE_MAX_D = 4096
#: Largest branching considered (a level's domain is B^l; beyond this a flat oracle is the same thing).
MAX_BRANCHING = 64


def tree_height(D: int, B: int) -> int:
    """h = ⌈log_B D⌉ (integer arithmetic), at least 1."""
    h, size = 1, B
    while size < D:
        size *= B
        h += 1
    return h


def decompose(a: int, b: int, B: int, h: int) -> dict[int, np.ndarray]:
    """Minimal B-adic decomposition of the leaf range [a, b] of a B-ary tree of height h: {level: node indices}.

    Level 0 (the root) appears only for the whole padded domain. At most 2(B−1) nodes per level.
    """
    out: dict[int, list[int]] = {}
    lo, hi = a, b + 1  # half-open, in units of the current level's nodes
    for level in range(h, 0, -1):
        nodes: list[int] = []
        while lo < hi and lo % B:
            nodes.append(lo)
            lo += 1
        while lo < hi and hi % B:
            hi -= 1
            nodes.append(hi)
        if nodes:
            out[level] = sorted(nodes)
        if lo >= hi:
            break
        lo, hi = lo // B, hi // B
    else:
        if lo < hi:
            out[0] = [0]
    return {lvl: np.asarray(v, dtype=np.int64) for lvl, v in out.items()}


class HierarchicalIntervals(AnalyticDistribution):
    """Hierarchical intervals over D buckets with branching B and a level oracle (see the module docstring)."""

    def __init__(self, epsilon: float, D: int, branching: int = 4, oracle: str = "oue",
                 consistency: bool = True) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
        self.B = check_int(branching, "branching", minimum=2, maximum=MAX_BRANCHING)
        self.oracle_name = check_oracle(oracle)
        if not isinstance(consistency, bool):
            raise ValueError(f"consistency must be True or False, got {consistency!r}")
        self.consistency = consistency
        self.h = tree_height(self.D, self.B)
        self.leaves = self.B**self.h
        #: oracles[l] reports level l (index 0 unused: the root is known).
        self.oracles = [None] + [make_oracle(self.oracle_name, self.epsilon, self.B**lvl) for lvl in range(1, self.h + 1)]
        oracle_entry = catalogue.entry(self.oracle_name)
        #: widths[l]: values in level l's oracle row (its catalogue row shape: OUE B^l bits, OLH 2); index 0 unused.
        self._widths = [0] + [int(np.prod(oracle_entry.row_shape(o), dtype=np.int64)) for o in self.oracles[1:]]
        #: the dtype of the oracles' report rows (OUE uint8 bits, OLH int64 [seed, y]).
        self._dtype = self.oracles[1].report_dtype
        if self._widths[self.h] > 4 * MAX_BUCKETS:
            raise ValueError(f"B^h = {self.leaves} leaves is too wide for unary reports")
        self.epsilon = self.oracles[1].epsilon
        self.p, self.q = self.oracles[1].p, self.oracles[1].q
        self.method = f"hierarchical_{self.oracle_name}_B{self.B}"

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "branching": self.B, "oracle": self.oracle_name, "consistency": self.consistency}

    @property
    def row_width(self) -> int:
        """1 (the level) + the widest level oracle's row: OUE 1 + B^h, OLH 3."""
        return 1 + self._widths[self.h]

    # ------------------------------------------------------------------ client
    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        from protocols.frequency._common import user_values

        v = user_values(values, self.D)
        n = v.size
        levels = rng.integers(1, self.h + 1, size=n)
        out = np.zeros((n, self.row_width), dtype=self._dtype)
        out[:, 0] = levels
        for lvl in range(1, self.h + 1):
            at = np.flatnonzero(levels == lvl)
            if at.size == 0:
                continue
            node = v[at] // self.B ** (self.h - lvl)
            out[at, 1 : 1 + self._widths[lvl]] = self.oracles[lvl].privatize(node, rng)
        return out

    def _level_rows(self, reports: Any, lvl: int, rows: np.ndarray) -> np.ndarray:
        """Level ``lvl``'s oracle row within hierarchical rows (after the level column; OUE rows are zero-padded)."""
        return rows[:, 1 : 1 + self._widths[lvl]]

    def _check(self, reports: Any) -> np.ndarray:
        r = np.asarray(reports)
        if r.ndim != 2 or r.shape[1] != self.row_width:
            raise ValueError(f"hierarchical reports must have shape (n, {self.row_width}), got {r.shape}")
        if r.size and not (np.issubdtype(r.dtype, np.integer) or r.dtype == np.bool_):
            raise ValueError(f"hierarchical reports must be integers, got dtype {r.dtype}")
        if r.shape[0] and (r[:, 0].min() < 1 or r[:, 0].max() > self.h):
            raise ValueError(f"report levels must lie in [1, {self.h}]")
        return r

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[report | bucket]`` = (1/h)·(the level oracle's likelihood of the node); OLH: given the seed."""
        r = self._check(reports)
        v = int(check_int(value, "value", minimum=0, maximum=self.D - 1))
        out = np.empty(r.shape[0])
        for lvl in range(1, self.h + 1):
            at = r[:, 0] == lvl
            if np.any(at):
                node = v // self.B ** (self.h - lvl)
                out[at] = self.oracles[lvl].likelihood(self._level_rows(r, lvl, r[at]), node) / self.h
        return out

    # ------------------------------------------------------------------ server
    def level_statistics(self, reports: Any) -> list[tuple[int, np.ndarray]]:
        """Sufficient statistics per level l = 1..h: (n_l, support counts over B^l nodes). Additive over reports."""
        r = self._check(reports)
        out = []
        for lvl in range(1, self.h + 1):
            at = r[:, 0] == lvl
            rows = self._level_rows(r, lvl, r[at]).astype(self._dtype, copy=False)
            n_l = int(np.count_nonzero(at))
            counts = self.oracles[lvl].support_counts(rows) if n_l else np.zeros(self.B**lvl, dtype=np.int64)
            out.append((n_l, np.asarray(counts, dtype=float)))
        return out

    def level_estimates_from_statistics(self, stats: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """[root = [1.0], f̂_1, …, f̂_h]: raw unbiased node fractions per level (ValueError if a level is empty)."""
        out = [np.ones(1)]
        for lvl, (n_l, counts) in enumerate(stats, start=1):
            if n_l <= 0:
                raise ValueError(f"no reports at tree level {lvl}: too few reports to estimate")
            out.append(np.asarray(self.oracles[lvl].estimate_counts(counts, n_l), dtype=float))
        return out

    def level_estimates(self, reports: Any) -> list[np.ndarray]:
        return self.level_estimates_from_statistics(self.level_statistics(reports))

    def statistics_total(self, reports: Any) -> np.ndarray:
        """:meth:`level_statistics` flattened: per level l = 1..h, n_l then the B^l support counts."""
        return np.concatenate([np.concatenate([[float(n_l)], counts]) for n_l, counts in self.level_statistics(reports)])

    @property
    def statistics_size(self) -> int:
        return sum(1 + self.B**lvl for lvl in range(1, self.h + 1))

    def _unflatten(self, total: Any) -> list[tuple[int, np.ndarray]]:
        t = np.asarray(total, dtype=float)
        width = self.statistics_size
        if t.shape != (width,):
            raise ValueError(f"hierarchical statistics have {width} values, got shape {t.shape}")
        out, at = [], 0
        for lvl in range(1, self.h + 1):
            out.append((int(t[at]), t[at + 1 : at + 1 + self.B**lvl]))
            at += 1 + self.B**lvl
        return out

    def _tree_from_statistics(self, total: Any) -> list[np.ndarray]:
        levels = self.level_estimates_from_statistics(self._unflatten(total))
        return self.consistent_levels(levels) if self.consistency else levels

    def estimate_statistics(self, total: Any, n: int) -> np.ndarray:
        return self._tree_from_statistics(total)[self.h][: self.D].copy()

    def prefix_from_statistics(self, total: Any, n: int) -> np.ndarray:
        tree = self._tree_from_statistics(total)
        return np.array([self.range_from_tree(tree, 0, j) for j in range(self.D)])

    def consistent_levels(self, levels: list[np.ndarray]) -> list[np.ndarray]:
        """Hay et al.'s constrained inference (module docstring) with the exact root 1."""
        B, h = self.B, self.h
        z = [None] * (h + 1)
        z[h] = np.asarray(levels[h], dtype=float)
        for lvl in range(h - 1, 0, -1):
            i = h - lvl + 1
            a = (B**i - B ** (i - 1)) / (B**i - 1)
            z[lvl] = a * levels[lvl] + (1 - a) * z[lvl + 1].reshape(-1, B).sum(axis=1)
        out = [np.ones(1)]
        for lvl in range(1, h + 1):
            sums = z[lvl].reshape(-1, B).sum(axis=1)
            out.append(z[lvl] + np.repeat((out[lvl - 1] - sums) / B, B))
        return out

    def tree(self, reports: Any) -> list[np.ndarray]:
        """Node estimates per level (consistent when ``consistency``, else raw)."""
        levels = self.level_estimates(reports)
        return self.consistent_levels(levels) if self.consistency else levels

    def estimate(self, reports: Any) -> np.ndarray:
        """Bucket fractions: the leaf level (unbiased; with consistency, the leaves of the consistent tree)."""
        return self.tree(reports)[self.h][: self.D].copy()

    def range_from_tree(self, tree: list[np.ndarray], a: int, b: int) -> float:
        a, b = check_range(a, b, self.D)
        return float(sum(float(np.sum(tree[lvl][nodes])) for lvl, nodes in decompose(a, b, self.B, self.h).items()))

    def range_query(self, reports: Any, a: int, b: int) -> float:
        """Sum of the decomposition's node estimates (unbiased; consistent tree when ``consistency``)."""
        return self.range_from_tree(self.tree(reports), a, b)

    def prefix_estimates(self, reports: Any) -> np.ndarray:
        tree = self.tree(reports)
        return np.array([self.range_from_tree(tree, 0, j) for j in range(self.D)])

    def range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        """First-order per-user variance of the range estimate at true range fraction f, the population spread
        evenly inside and outside the range: of the consistent estimate (:meth:`query_variances`) when
        ``consistency``, else of the raw one (:meth:`raw_range_variance`)."""
        a, b = check_range(a, b, self.D)
        if not self.consistency:
            return self.raw_range_variance(a, b, f)
        fa = np.asarray(f, dtype=float)
        length = b - a + 1
        inside = np.zeros(self.D, dtype=bool)
        inside[a : b + 1] = True
        weights = inside[None, :].astype(float)
        out = np.empty(fa.shape)
        for idx, fv in np.ndenumerate(fa):
            hist = np.where(inside, fv / length, (1.0 - fv) / (self.D - length) if length < self.D else 0.0)
            out[idx] = self.query_variances(weights, hist)[0]
        return out if out.ndim else float(out)

    def _consistency_adjoint(self, leaf_weights: np.ndarray) -> list[np.ndarray]:
        """The raw node weights of leaf-linear queries on the consistent tree: for each row w of ``leaf_weights``
        (Q × D), the vectors u_l (l = 1..h) with ``Σ_leaves w·x̄ = Σ_l u_l·x̃_l + constant`` (the adjoint of
        :meth:`consistent_levels`' linear part, applied in reverse order)."""
        B, h = self.B, self.h
        Q = leaf_weights.shape[0]
        obar = np.zeros((Q, self.leaves))
        obar[:, : self.D] = leaf_weights
        zbar: list[np.ndarray] = [np.zeros((Q, 1))] * (h + 1)
        for lvl in range(h, 0, -1):  # top-down pass: o_l = z_l + R(o_{l-1} − S z_l)/B
            parent = obar.reshape(Q, -1, B).sum(axis=2)
            zbar[lvl] = obar - np.repeat(parent, B, axis=1) / B
            obar = parent / B
        xbar: list[np.ndarray] = [np.zeros((Q, 1))] * (h + 1)
        for lvl in range(1, h):  # bottom-up pass: z_l = a·x_l + (1 − a)·S z_{l+1}
            i = h - lvl + 1
            a = (B**i - B ** (i - 1)) / (B**i - 1)
            xbar[lvl] = a * zbar[lvl]
            zbar[lvl + 1] = zbar[lvl + 1] + (1 - a) * np.repeat(zbar[lvl], B, axis=1)
        xbar[h] = zbar[h]
        return xbar[1:]

    def query_variances(self, leaf_weights: Any, hist: Any) -> np.ndarray:
        """First-order per-user variance of ``Σ_j w_j·x̄_j`` for each row w of ``leaf_weights`` (Q × D), x̄ the
        consistent leaf estimates, for a population with bucket fractions ``hist``.

        With u_l the raw node weights of the query (:meth:`_consistency_adjoint`; the indicator of the leaves for
        the raw tree), g_l(v) = u_l[node_l(v)] and G = Σ_l g_l:

            Var = h · Σ_l [ Σ_i u_{l,i}² V_{l,i} + Var_v g_l ] − Var_v G,
            V_{l,i} = (f_{l,i}p(1−p) + (1−f_{l,i})q(1−q))/(p−q)²

        (the oracle's noise at level l with n/h users, plus the sampling of users into levels: each user adds
        h·(g_L(v) − mean) for its uniformly drawn level L). With the indicator weights of a range's B-adic
        decomposition this is the raw formula of the module docstring. OLH: node noises taken as uncorrelated
        (idealised, as for flat OLH).
        """
        if not self.consistency:
            raise ValueError("query_variances is for the consistent tree (the raw tree is not additive: a raw range "
                             "is its B-adic decomposition, see raw_range_variance)")
        W = np.atleast_2d(np.asarray(leaf_weights, dtype=float))
        f = np.zeros(self.leaves)
        f[: self.D] = np.asarray(hist, dtype=float)
        nodes = self._consistency_adjoint(W)
        total = np.zeros(W.shape[0])
        G = np.zeros((W.shape[0], 1))  # G restricted to level l's nodes: Σ_{l' ≤ l} u_{l'}[ancestor], built top-down
        for lvl, u in enumerate(nodes, start=1):
            fl = f.reshape(-1, self.B ** (self.h - lvl)).sum(axis=1)
            noise = (fl * self.p * (1 - self.p) + (1 - fl) * self.q * (1 - self.q)) / (self.p - self.q) ** 2
            u2 = u**2
            total += u2 @ (noise + fl) - (u @ fl) ** 2
            G = np.repeat(G, self.B, axis=1) + u
        return self.h * total - ((G**2) @ f - (G @ f) ** 2)

    def plugin_variances(self, hist: np.ndarray, cdf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bucket and prefix variances (:meth:`query_variances`) at the plug-in histogram: the estimate clipped at 0
        and renormalised (uniform if nothing is left). Queries in chunks (memory O(chunk · B^h)); the cost is
        O(D · B^h), so beyond :data:`EXACT_VARIANCE_MAX_D` buckets (and for the raw tree) the per-range raw
        formula is used instead — conservative for the consistent estimate, whose variance it exceeds in every
        case the tests check."""
        if not self.consistency or self.D > EXACT_VARIANCE_MAX_D:
            clip = lambda x: float(np.clip(x, 0.0, 1.0))  # noqa: E731
            return (np.array([self.raw_range_variance(j, j, clip(hist[j])) for j in range(self.D)]),
                    np.array([self.raw_range_variance(0, j, clip(cdf[j])) for j in range(self.D)]))
        f = np.clip(np.asarray(hist, dtype=float), 0.0, None)
        f = f / f.sum() if f.sum() > 0 else np.full(self.D, 1.0 / self.D)
        eye = np.eye(self.D)
        out = []
        for weights in (eye, np.tril(np.ones((self.D, self.D)))):  # buckets, then prefixes [0, j]
            step = max(1, (1 << 22) // (self.leaves * (self.h + 1)))
            out.append(np.concatenate([self.query_variances(weights[i : i + step], f)
                                       for i in range(0, self.D, step)]))
        return out[0], out[1]

    def raw_range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        """First-order per-user variance of the raw range estimate (module docstring); f split by piece length."""
        a, b = check_range(a, b, self.D)
        f = np.asarray(f, dtype=float)
        parts = decompose(a, b, self.B, self.h)
        if 0 in parts:
            return np.zeros_like(f) + 0.0
        length = b - a + 1
        total = 0.0
        for lvl, nodes in parts.items():
            m = nodes.size
            f_l = f * (m * self.B ** (self.h - lvl)) / length
            total = total + oracle_range_variance(self.p, self.q, m, f_l) + f_l * (1 - f_l)
        return self.h * total - f * (1 - f)
