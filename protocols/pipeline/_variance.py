"""Exact per-user variance of linear queries on "linear-coefficient" reports, and its worst case over records.

Every vector mechanism of the pipeline reports noisy versions ``Y_j`` of linear coefficients ``θ = A x`` of the
user's record ``x ∈ [-1, 1]^d`` (``A = I`` for k-sampling and Duchi's multi-dimensional mechanism on x; ``A`` =
the Haar analysis matrix for :class:`~protocols.pipeline.HaarRecord`). For all of them

* ``E[Y_j] = θ_j`` and ``Var(Y_j) = a_j + g'_j θ_j²`` (every 1-D mechanism here — Duchi, PM, HM, PDP — and
  k-sampling have variances linear in t², SPEC §3.1–3.6; this is checked numerically when a model is built);
* coordinates reported by one joint mechanism (the *correlated block* J) have ``Cov(Y_j, Y_l) = -C θ_j θ_l``
  for j ≠ l in J, and independent noise otherwise:

  - k-sampling over P coordinates with k samples (Wang et al., ICDE 2019): ``E[Y_j Y_l] =
    P[both sampled]·(P/k)²·θ_j θ_l = κ θ_j θ_l`` with ``κ = P(k-1)/(k(P-1))``, so ``C = 1 - κ``;
  - Duchi's multi-dimensional mechanism: ``E[s_j s_l | v] = 0`` for j ≠ l (the flip ``s ↦ -s`` pairs T+ with
    T- and the tie weights sum to zero), and ``E[v_j v_l] = θ_j θ_l`` for independent rounding, so
    ``Cov = -θ_j θ_l``: ``C = 1``.

For query weights ω (``q = ω·θ``, e.g. one coordinate of the inverse Haar transform, or a range sum):

    Var(ω·Y | x) = Σ_j ω_j² (a_j + g_j θ_j²) - C (Σ_{j∈J} ω_j θ_j)²,      g_j = g'_j + C·1[j ∈ J],

a quadratic form in x. :meth:`QuadraticModel.variance` evaluates it exactly at given records;
:meth:`QuadraticModel.worst` maximises it over the record cube ``[-1, 1]^d`` in reduced variables: only the
coefficients a query touches matter, and record coordinates whose columns of A agree on them enter only through
their block mean, free in [-1, 1] (:meth:`QuadraticModel.reduced_form`; a Haar coordinate has L + 1 blocks
whatever d is). Up to 16 blocks every vertex is tried (exact when the form is convex — a convex function's
maximum over a box is at a vertex), beyond that a deterministic set of structured and leading-eigenvector sign
patterns; in every case exact coordinate ascent follows from the best vertices (each coordinate of a quadratic
is maximised in closed form, which finds interior maxima when the form is not convex). Tests check the result
against exhaustive face enumeration.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["QuadraticModel", "quadratic_coefficients", "ksampling_cross", "ENUMERATION_MAX_D"]

#: Largest record dimension for which :meth:`QuadraticModel.worst` enumerates all 2^(d-1) sign patterns.
ENUMERATION_MAX_D = 16


def quadratic_coefficients(variance: Any, name: str) -> tuple[float, float]:
    """``(a, g')`` with ``variance(t) = a + g'·t²`` on [-1, 1], checked at t = 0.5 and t = 0.25.

    Raises ValueError when the mechanism's variance is not of that form (the exact formulas would not apply).
    """
    v0 = float(np.max(variance(np.array([0.0]))))
    v1 = float(np.max(variance(np.array([1.0]))))
    a, g = v0, v1 - v0
    for t in (0.5, 0.25):
        vt = float(np.max(variance(np.array([t]))))
        if abs(vt - (a + g * t * t)) > 1e-9 * max(1.0, abs(vt)):
            raise ValueError(f"{name}: variance is not of the form a + g·t² (at t={t}: {vt} vs {a + g * t * t})")
    return a, g


def ksampling_cross(P: int, k: int) -> float:
    """``C = 1 - κ`` with ``κ = P(k-1)/(k(P-1))`` for k-sampling over P coordinates (0 when P = 1: no pairs)."""
    if P <= 1:
        return 0.0
    return 1.0 - P * (k - 1) / (k * (P - 1))


@dataclass(frozen=True)
class QuadraticModel:
    """``Var(ω·Y | x) = Σ_j ω_j²(a_j + g_j θ_j²) - C(Σ_{j∈J} ω_j θ_j)²``, ``θ = A x`` (see the module docstring).

    Attributes:
        analysis: A, shape (P, d).
        base: a, shape (P,).
        curvature: g (already including the ``+C`` of the correlated block), shape (P,).
        correlated: boolean mask of J, shape (P,).
        cross: C ≥ 0.
    """

    analysis: np.ndarray
    base: np.ndarray
    curvature: np.ndarray
    correlated: np.ndarray
    cross: float

    @property
    def d(self) -> int:
        return int(self.analysis.shape[1])

    def _weights(self, weights: Any) -> np.ndarray:
        w = np.atleast_2d(np.asarray(weights, dtype=float))
        if w.shape[1] != self.analysis.shape[0]:
            raise ValueError(f"query weights must have {self.analysis.shape[0]} entries, got shape {w.shape}")
        return w

    def variance(self, records: Any, weights: Any) -> np.ndarray:
        """Exact per-user variance of each query at each record: records (n, d), weights (Q, P) → (n, Q)."""
        w = self._weights(weights)
        x = np.atleast_2d(np.asarray(records, dtype=float))
        theta = x @ self.analysis.T
        out = (theta**2) @ (w**2 * self.curvature).T + (w**2) @ self.base
        if self.cross:
            J = self.correlated
            out -= self.cross * (theta[:, J] @ w[:, J].T) ** 2
        return out

    def form(self, weights: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(const (Q,), M (Q, d, d))`` with ``Var = const + xᵀ M x`` for each query."""
        w = self._weights(weights)
        A = self.analysis
        const = (w**2) @ self.base
        M = np.einsum("pi,qp,pj->qij", A, w**2 * self.curvature, A)
        if self.cross:
            J = self.correlated
            v = w[:, J] @ A[J]  # (Q, d)
            M -= self.cross * v[:, :, None] * v[:, None, :]
        return const, M

    def worst(self, weights: Any) -> np.ndarray:
        """``max_{x ∈ [-1,1]^d} Var(ω·Y | x)`` for each query (Q,), see the module docstring for the method."""
        w = self._weights(weights)
        return np.array([self._worst_one(row) for row in w])

    def reduced_form(self, weights: Any) -> tuple[float, np.ndarray]:
        """``(const, M)`` with ``max_x Var = const + max_{y ∈ [-1,1]^b} yᵀ M y`` (one query; see :meth:`worst`).

        Only the coefficients the query touches (ω_j ≠ 0) matter; record coordinates whose columns of A agree on
        those rows enter only through their block mean ȳ_b ∈ [-1, 1], free and independent across blocks, with
        ``θ = Σ_b |b|·A[:, b]·ȳ_b``. For a Haar coordinate the blocks are the L siblings along the leaf's path and
        the leaf itself (b = L + 1), whatever d is.
        """
        w = self._weights(weights)
        if w.shape[0] != 1:
            raise ValueError("reduced_form takes one query")
        w = w[0]
        const = float((w**2) @ self.base)
        touched = w != 0
        A = self.analysis[touched]
        used = np.any(A != 0, axis=0)
        if not used.any():
            return const, np.zeros((0, 0))
        cols, inverse = np.unique(A[:, used].T, axis=0, return_inverse=True)
        A_red = cols.T * np.bincount(inverse.reshape(-1), minlength=cols.shape[0])  # (|touched|, b)
        wt = w[touched]
        M = A_red.T @ ((wt**2 * self.curvature[touched])[:, None] * A_red)
        if self.cross:
            J = self.correlated[touched]
            v = A_red[J].T @ wt[J]
            M -= self.cross * np.outer(v, v)
        return const, M

    def _worst_one(self, w: np.ndarray) -> float:
        const, M = self.reduced_form(w[None, :])
        b = M.shape[0]
        if b == 0:
            return const
        if b <= ENUMERATION_MAX_D:
            starts = _all_vertices(b)
        else:
            starts = _structured_vertices(b)
            _, vecs = np.linalg.eigh(M)  # the sign patterns of the leading eigenvectors
            eig = np.sign(vecs[:, -min(b, 8) :].T)
            eig[eig == 0] = 1.0
            starts = np.concatenate([starts, eig])
        vals = np.einsum("si,si->s", starts @ M, starts)
        top = np.argsort(-vals, kind="stable")[: min(4, vals.size)]
        return const + _coordinate_ascent(M, starts[top])


def _structured_vertices(b: int) -> np.ndarray:
    """Deterministic start vertices when 2^(b-1) is too many: constant, alternating and step patterns."""
    idx = np.arange(b)
    patterns = [np.ones(b), np.where(idx % 2 == 0, 1.0, -1.0)]
    patterns.extend(np.where(idx < i, 1.0, -1.0) for i in range(1, b))
    patterns.extend(np.where((idx // p) % 2 == 0, 1.0, -1.0) for p in (2, 4, 8) if p < b)
    return np.array(patterns)


@functools.lru_cache(maxsize=32)
def _all_vertices(d: int) -> np.ndarray:
    """The 2^(d-1) sign vectors with first entry +1 (x and -x give the same quadratic form value)."""
    idx = np.arange(1 << (d - 1), dtype=np.int64)[:, None]
    rest = 1.0 - 2.0 * ((idx >> np.arange(d - 1)) & 1)
    out = np.concatenate([np.ones((idx.shape[0], 1)), rest], axis=1)
    out.setflags(write=False)
    return out


def _coordinate_ascent(M: np.ndarray, starts: np.ndarray, max_sweeps: int = 200) -> float:
    """Maximise ``xᵀ M x`` over [-1, 1]^d from each start by exact one-coordinate maximisation; best value."""
    x = np.array(starts, dtype=float, copy=True)
    diag = np.diag(M).copy()
    value = np.einsum("si,ij,sj->s", x, M, x)
    for _ in range(max_sweeps):
        before = value.copy()
        for j in range(M.shape[0]):
            b = x @ M[:, j] - x[:, j] * diag[j]  # f(x_j) = M_jj x_j² + 2 b x_j + const
            if diag[j] > 0:
                new = np.where(b > 0, 1.0, np.where(b < 0, -1.0, x[:, j]))
            elif diag[j] < 0:
                new = np.clip(-b / diag[j], -1.0, 1.0)
            else:
                new = np.where(b > 0, 1.0, np.where(b < 0, -1.0, x[:, j]))
            x[:, j] = new
        value = np.einsum("si,ij,sj->s", x, M, x)
        if np.all(value - before <= 1e-13 * np.maximum(1.0, np.abs(value))):
            break
    return float(value.max())
