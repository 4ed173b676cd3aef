"""The Haar transform of the edge pipeline (SPEC §2.4) and HaarHRR range queries under LDP.

**Transform (SPEC §2.4).** A record of d values is padded with zeros to D = 2^L leaves (L = ⌈log2 d⌉, D ≥ 2)
and decomposed over the complete binary tree on those leaves:

* mean ``m = (1/D) Σ_i x_i``;
* for every internal node, detail ``c = (mean(left subtree) - mean(right subtree)) / 2``, listed breadth-first
  (the node at depth h, position i within its level, is at index ``2^h - 1 + i``; D - 1 details in all);
* inverse: ``x_i = m + Σ_{ancestors a of i} ±c_a`` with ``+`` when i lies in the left subtree of a.

Because a node's mean is the average of its children's means and ``c`` is half their difference, every m and c
lies in [-1, 1] whenever x does. Each reconstructed coordinate sums L + 1 coefficients, so with independent
noise of variances ``var_m`` and ``var_c`` the reconstruction has per-coordinate variance
``var_m + Σ_{ancestors} var_c`` (:func:`haar_inverse_variance`); a range sum ``Σ_{i=a..b} x_i`` touches only the
O(log D) nodes that partially overlap [a, b] (:func:`haar_range_weights`). This is the structure Privelet
(Xiao, Wang, Gehrke, ICDE 2010) and HaarHRR exploit.

**HaarHRR** (Cormode, Kulkarni, Srivastava, "Answering range queries under local differential privacy",
PVLDB 12(10), 2019): see :class:`HaarHRR`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import AnalyticMechanism, check_categories, check_epsilon, check_int

__all__ = [
    "padded_size",
    "haar_forward",
    "haar_inverse",
    "haar_inverse_variance",
    "haar_synthesis_matrix",
    "haar_analysis_matrix",
    "haar_range_weights",
    "HaarHRR",
]


def padded_size(d: int) -> int:
    """D = 2^⌈log2 d⌉, at least 2: the number of leaves of the Haar tree over d values."""
    d = check_int(d, "d", minimum=1)
    return max(2, 1 << (d - 1).bit_length())


def _levels(D: int) -> int:
    return D.bit_length() - 1


def haar_forward(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Batch Haar analysis: x of shape (n, d) (or (d,)) → (m of shape (n,), c of shape (n, D-1)).

    ``m`` is the mean of the D zero-padded values, ``c`` the breadth-first details
    ``(mean(left) - mean(right))/2``. A 1-D input returns a scalar-shaped ``m`` (shape ()) and ``c`` of shape (D-1,).
    Vectorised over users; the only Python loop is over the L levels.
    """
    arr = np.asarray(x, dtype=float)
    single = arr.ndim == 1
    if single:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"haar_forward expects shape (n, d) or (d,) with d >= 1, got {np.shape(x)}")
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError("haar_forward input must be finite")
    n, d = arr.shape
    D = padded_size(d)
    means = np.zeros((n, D))
    means[:, :d] = arr
    details_by_depth: list[np.ndarray] = []
    while means.shape[1] > 1:  # from the deepest internal level up to the root
        left, right = means[:, 0::2], means[:, 1::2]
        details_by_depth.append((left - right) / 2.0)
        means = (left + right) / 2.0
    c = np.concatenate(details_by_depth[::-1], axis=1)  # breadth-first: root first
    m = means[:, 0]
    if single:
        return m[0], c[0]
    return m, c


def haar_inverse(m: Any, c: Any, d: int) -> np.ndarray:
    """Batch Haar synthesis: ``x_i = m + Σ_{ancestors} ±c`` (+ in the left subtree), truncated to d values.

    ``m`` has shape (n,) and ``c`` shape (n, D-1) with D = padded_size(d); scalar m with 1-D c gives shape (d,).
    """
    D = padded_size(d)
    m_arr = np.asarray(m, dtype=float)
    c_arr = np.asarray(c, dtype=float)
    single = c_arr.ndim == 1
    if single:
        c_arr = c_arr[None, :]
        m_arr = m_arr.reshape(1)
    if c_arr.ndim != 2 or c_arr.shape[1] != D - 1:
        raise ValueError(f"c must have shape (n, {D - 1}) for d={d}, got {np.shape(c)}")
    if m_arr.shape != (c_arr.shape[0],):
        raise ValueError(f"m must have shape ({c_arr.shape[0]},), got {np.shape(m)}")
    n = c_arr.shape[0]
    values = m_arr[:, None]
    for h in range(_levels(D)):
        ch = c_arr[:, (1 << h) - 1 : (1 << (h + 1)) - 1]
        children = np.empty((n, 1 << (h + 1)))
        children[:, 0::2] = values + ch
        children[:, 1::2] = values - ch
        values = children
    out = values[:, :d]
    return out[0] if single else out


def haar_inverse_variance(var_m: Any, var_c: Any, d: int) -> np.ndarray:
    """Per-coordinate variance of :func:`haar_inverse` when m and every c carry independent noise.

    ``Var x̂_i = var_m + Σ_{ancestors a of i} var_c[a]`` (the ±1 signs square away): each coordinate sums
    log2(D) + 1 terms. ``var_c`` is a scalar (same variance for every detail) or an array of shape (D-1,).
    Returns shape (d,).
    """
    D = padded_size(d)
    vm = float(var_m)
    vc = np.broadcast_to(np.asarray(var_c, dtype=float), (D - 1,))
    if vm < 0 or np.any(vc < 0) or not math.isfinite(vm) or not np.all(np.isfinite(vc)):
        raise ValueError("variances must be finite and non-negative")
    values = np.array([vm])
    for h in range(_levels(D)):
        ch = vc[(1 << h) - 1 : (1 << (h + 1)) - 1]
        values = np.repeat(values + ch, 2)
    return values[:d]


def haar_synthesis_matrix(d: int) -> np.ndarray:
    """B of shape (d, D): ``x = B @ [m, c_0, …, c_{D-2}]`` (entries 1 for m, ±1 on ancestors, 0 elsewhere)."""
    D = padded_size(d)
    eye = np.eye(D)
    return haar_inverse(eye[:, 0], eye[:, 1:], d).T


def haar_analysis_matrix(d: int) -> np.ndarray:
    """A of shape (D, d): ``[m, c] = A @ x`` for the zero-padded transform (rows: m, then breadth-first c)."""
    m, c = haar_forward(np.eye(d))
    return np.concatenate([m[None, :], c.T], axis=0)


def haar_range_weights(d: int, a: int, b: int) -> tuple[float, np.ndarray]:
    """Weights with ``Σ_{i=a..b} x_i = w_m·m + w_c·c`` for the inclusive range [a, b] ⊆ [0, d).

    ``w_m = b - a + 1`` and, for the node with left/right leaf sets Lf/Rt, ``w_c = |Lf ∩ [a,b]| - |Rt ∩ [a,b]|``:
    zero for nodes inside or outside the range, so at most two non-zero weights per level (O(log D) in all).
    With independent noise the range sum has variance ``w_m²·var_m + Σ w_c²·var_c``.
    """
    D = padded_size(d)
    a, b = _check_range(a, b, d)
    weights = np.empty(D - 1)
    hi = b + 1
    for h in range(_levels(D)):
        width = D >> h
        starts = np.arange(1 << h) * width
        mids = starts + width // 2
        ends = starts + width
        left = np.clip(np.minimum(mids, hi) - np.maximum(starts, a), 0, None)
        right = np.clip(np.minimum(ends, hi) - np.maximum(mids, a), 0, None)
        weights[(1 << h) - 1 : (1 << (h + 1)) - 1] = left - right
    return float(b - a + 1), weights


def _check_range(a: Any, b: Any, k: int) -> tuple[int, int]:
    a = check_int(a, "a", minimum=0, maximum=k - 1)
    b = check_int(b, "b", minimum=0, maximum=k - 1)
    if a > b:
        raise ValueError(f"range [a, b] needs a <= b, got a={a}, b={b}")
    return a, b


def _hadamard_entries(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Sylvester Hadamard entries H[r, c] = (-1)^{popcount(r & c)} (elementwise, int64 in, ±1 int8 out)."""
    x = np.asarray(rows, dtype=np.int64) & np.asarray(cols, dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        x = x ^ (x >> shift)
    return (1 - 2 * (x & 1)).astype(np.int8)


def _fwht(values: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh–Hadamard transform along the last axis (length a power of two): returns H·v."""
    out = np.array(values, dtype=float, copy=True)
    n = out.shape[-1]
    h = 1
    while h < n:
        shaped = out.reshape(*out.shape[:-1], n // (2 * h), 2, h)
        top = shaped[..., 0, :].copy()
        bottom = shaped[..., 1, :]
        shaped[..., 0, :] = top + bottom
        shaped[..., 1, :] = top - bottom
        h *= 2
    return out


class HaarHRR(AnalyticMechanism):
    """Range queries over the ordered domain [0, k) under ε-LDP (Cormode, Kulkarni, Srivastava, PVLDB 2019).

    A user's one-hot vector e_v has, at each depth h = 0..L-1 of the Haar tree (D = padded_size(k) = 2^L leaves),
    exactly one non-zero detail: at node ``i = v >> (L-h)`` with value ``s·2^h/D``, ``s = +1`` if v is in the
    node's left subtree (bit L-h-1 of v is 0), else -1. The mean m = 1/D is the same for everyone.

    **Client.** Sample a depth h uniformly from {0..L-1}; with M = 2^h, view the level as the signed one-hot
    vector ``w = s·e_i`` ∈ {-1,0,1}^M; sample a Hadamard index j uniformly from [0, M) and compute
    ``b = H_M[j, i]·s ∈ {±1}`` (Sylvester H, so ``(H w)_j = b``); report ``(h, j, y)`` with ``y = b`` w.p.
    ``p = e^ε/(1+e^ε)``, else ``-b``. Privacy: (h, j) is independent of v and ``P[y | v]`` ∈ {p, 1-p}, so the
    likelihood ratio of any report is at most ``p/(1-p) = e^ε``: exactly ε-LDP.

    **Server.** ``E[y·H_M[j,i']] = (2p-1)·w_{i'}`` for every i' (orthogonality of H), so with the Horvitz–Thompson
    weight L for the level sampling, user u contributes the unbiased estimate
    ``Ŵ_{h,i} = L·1[h_u = h]·H[i, j_u]·y_u/(2p-1)`` of the level vector W_h (the population average of w;
    computed for all i at once with one fast Walsh–Hadamard transform per level). Details
    ``ĉ_{h,i} = (2^h/D)·Ŵ_{h,i}``, then the inverse Haar transform with the known m = 1/D gives an unbiased
    frequency vector whose total over the D leaves is exactly 1.

    **Range [a, b]** (ℓ = b-a+1): ``R̂ = ℓ/D + Σ_{h,i} ω_{h,i}·Ŵ_{h,i}`` with ``ω_{h,i} = (2^h/D)·g_{h,i}``,
    g from :func:`haar_range_weights` (≤ 2 non-zero per level). Per user ``X_u = ℓ/D + L·y_u·(H ω_{h_u})_{j_u}/(2p-1)``
    with ``E[X_u] = 1[v_u ∈ [a,b]]`` and, since ``E_j[(Hω_h)_j²] = ||ω_h||²``,

        Var X_u = L·Σ_h ||ω_h||² / (2p-1)² - (1[v_u ∈ [a,b]] - ℓ/D)².

    Users are independent, so ``Var R̂ = (1/n)·range_variance(a, b, f)`` with f the true range fraction.
    """

    def __init__(self, epsilon: float, k: int) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2)
        self.D = padded_size(self.k)
        self.levels = _levels(self.D)
        e = math.exp(self.epsilon)
        self.p = e / (1.0 + e)
        self.q = 1.0 / (1.0 + e)
        self._gain = self.p - self.q  # 2p - 1 = (e^ε - 1)/(e^ε + 1)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "k": self.k}

    # ----------------------------------------------------------------- client
    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Reports of shape (n, 3), int64 columns (level h, Hadamard index j, bit y ∈ {-1, +1})."""
        v = check_categories(values, self.k).reshape(-1)
        n = v.size
        L = self.levels
        h = rng.integers(0, L, size=n)
        node = v >> (L - h)
        sign = 1 - 2 * ((v >> (L - h - 1)) & 1)
        j = rng.integers(0, np.int64(1) << h)  # uniform on [0, 2^h), one draw per user
        b = _hadamard_entries(j, node).astype(np.int64) * sign
        keep = rng.random(n) < self.p
        y = np.where(keep, b, -b)
        return np.stack([h.astype(np.int64), j, y], axis=1)

    def report_distribution(self, value: int) -> np.ndarray:
        """Exact P[report = (h, j, y) | value] over all 2(D-1) reports, ordered (h, j, y=-1), (h, j, y=+1).

        For verifying the likelihood ratio (ε-LDP) exactly; see :meth:`report_index`.
        """
        v = int(check_categories([value], self.k)[0])
        probs = []
        for h in range(self.levels):
            M = 1 << h
            node = v >> (self.levels - h)
            sign = 1 - 2 * ((v >> (self.levels - h - 1)) & 1)
            b = _hadamard_entries(np.arange(M), np.full(M, node)).astype(float) * sign
            p_plus = np.where(b > 0, self.p, self.q) / (self.levels * M)
            p_minus = np.where(b > 0, self.q, self.p) / (self.levels * M)
            probs.append(np.stack([p_minus, p_plus], axis=1).reshape(-1))
        return np.concatenate(probs)

    @staticmethod
    def report_index(reports: np.ndarray) -> np.ndarray:
        """Position of each report in :meth:`report_distribution`'s ordering."""
        r = np.asarray(reports, dtype=np.int64)
        return 2 * ((np.int64(1) << r[:, 0]) - 1 + r[:, 1]) + (r[:, 2] > 0)

    # ----------------------------------------------------------------- server
    def _check_reports(self, reports: Any) -> np.ndarray:
        r = np.asarray(reports)
        if r.ndim != 2 or r.shape[1] != 3:
            raise ValueError(f"HaarHRR reports must have shape (n, 3), got {r.shape}")
        if r.shape[0] == 0:
            raise ValueError("cannot estimate from zero reports")
        r = r.astype(np.int64)
        h, j, y = r[:, 0], r[:, 1], r[:, 2]
        if h.min() < 0 or h.max() >= self.levels:
            raise ValueError(f"report levels must lie in [0, {self.levels})")
        if j.min() < 0 or np.any(j >= (np.int64(1) << h)):
            raise ValueError("report Hadamard indices must lie in [0, 2^level)")
        if not np.all(np.abs(y) == 1):
            raise ValueError("report bits must be -1 or +1")
        return r

    def level_estimates(self, reports: Any) -> list[np.ndarray]:
        """Unbiased Ŵ_h (shape (2^h,)) for each depth h: the population mean of each user's signed level vector."""
        r = self._check_reports(reports)
        n = r.shape[0]
        scale = self.levels / (n * self._gain)
        out = []
        for h in range(self.levels):
            M = 1 << h
            at = r[:, 0] == h
            sums = np.bincount(r[at, 1], weights=r[at, 2].astype(float), minlength=M)
            out.append(scale * _fwht(sums))  # H symmetric: Σ_u H[i, j_u]·y_u = (H·sums)_i
        return out

    def haar_coefficients(self, reports: Any) -> tuple[float, np.ndarray]:
        """(m, ĉ) of the frequency vector over D leaves: m = 1/D exactly, ĉ_{h,i} = (2^h/D)·Ŵ_{h,i} breadth-first."""
        levels = self.level_estimates(reports)
        c = np.concatenate([(2.0**h / self.D) * w for h, w in enumerate(levels)])
        return 1.0 / self.D, c

    def estimate(self, reports: Any) -> np.ndarray:
        """Unbiased estimate of the (k,) vector of value frequencies (fractions of users)."""
        m, c = self.haar_coefficients(reports)
        return haar_inverse(m, c, self.D)[: self.k]

    def range_query(self, estimate_or_reports: Any, a: int, b: int) -> float:
        """Estimated fraction of users with value in [a, b] (inclusive), from an estimate or from raw reports."""
        a, b = _check_range(a, b, self.k)
        arr = np.asarray(estimate_or_reports)
        if arr.ndim == 2:
            arr = self.estimate(arr)
        if arr.shape != (self.k,):
            raise ValueError(f"expected a ({self.k},) frequency estimate or (n, 3) reports, got {arr.shape}")
        return float(np.sum(arr[a : b + 1], dtype=float))

    def _level_range_weights(self, a: int, b: int) -> list[np.ndarray]:
        """ω_h = (2^h/D)·g_h: weights of the range on the unit level vectors W_h."""
        _, g = haar_range_weights(self.D, a, b)
        return [(2.0**h / self.D) * g[(1 << h) - 1 : (1 << (h + 1)) - 1] for h in range(self.levels)]

    def range_contributions(self, reports: Any, a: int, b: int) -> np.ndarray:
        """Per-user unbiased contributions X_u (mean = :meth:`range_query`; E[X_u] = 1[v_u ∈ [a, b]])."""
        a, b = _check_range(a, b, self.k)
        r = self._check_reports(reports)
        out = np.full(r.shape[0], (b - a + 1) / self.D)
        for h, w in enumerate(self._level_range_weights(a, b)):
            at = r[:, 0] == h
            hw = _fwht(w)  # (H ω_h)_j
            out[at] += self.levels * r[at, 2] * hw[r[at, 1]] / self._gain
        return out

    def range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        """Per-user variance of the range estimate (divide by n): ``L·Σ_h||ω_h||²/(2p-1)² - (f(1-ℓ/D)² + (1-f)(ℓ/D)²)``.

        ``f`` is the true fraction of users in [a, b] (default 0, the worst case for ranges of length ≤ D/2).
        """
        a, b = _check_range(a, b, self.k)
        f = np.asarray(f, dtype=float)
        share = (b - a + 1) / self.D
        energy = sum(float(np.dot(w, w)) for w in self._level_range_weights(a, b))
        return self.levels * energy / self._gain**2 - (f * (1 - share) ** 2 + (1 - f) * share**2)

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of a point estimate f̂_v (the range [v, v]; the same for every v)."""
        return self.range_variance(0, 0, f)
