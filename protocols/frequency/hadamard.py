"""Hadamard response (HR) at every ε, and a vectorised fast Walsh–Hadamard transform.

Acharya, Sun, Zhang, "Hadamard response: estimating distributions privately, efficiently, and with little
communication", AISTATS 2019 (arXiv:1802.04705). ``H`` is the Sylvester–Hadamard matrix, ``H[s, y] =
(-1)^{popcount(s & y)}``. Every report is one integer ``y ∈ [0, K)`` and every item v has a *support set* ``C_v``
of outputs; the user holding x outputs ``y`` uniform on ``C_x`` w.p. ``p``, else uniform on its complement.

Support sets: intersections of ``m`` Hadamard rows (``rows = m``, ``t = 2^m``)
------------------------------------------------------------------------------------
The paper's high-privacy HR takes ``C_x = {y : H[x+1, y] = +1}`` (half the outputs, one row). Its variance
``((e^ε+1)/(e^ε-1))²`` is 1.27× the optimum ``4e^ε/(e^ε-1)²`` at ε = 1 and 2.4× at ε = 2, because at larger ε a
report should single out about 1/(e^ε+1) of the outputs, not one half. The paper's general construction (B blocks
of size b, sets of size b/2 inside a block, used by pure-ldp above ε = 1) shrinks the sets but makes the users of
one block interfere: its per-item variance grows with the mass of the item's block (``Var = (e^ε-1+2B)(2 +
F_block(e^ε-1))/(e^ε-1)² - f``), so summed over the items it is ≈ 2× the optimum at large ε for every B and
every population. Here the sets are shrunk *without* blocks, keeping every pair of items in the same relation:

    C_v = {y : H[s, y] = +1 for all s ∈ S_v},   S_v an m-dimensional subspace of row indices,

with the ``S_v`` pairwise intersecting only in 0 (a partial spread). Then ``|C_v| = K/t`` and, for v ≠ x,
``|C_v ∩ C_x| = K/t²``: a non-holder lands in ``C_v`` with probability exactly ``q = 1/t`` whatever it holds.

* ``m = 1`` (the paper's high-privacy HR, unchanged): ``K = 2^⌈log2(k+1)⌉``, ``S_v = {0, v+1}``.
* ``m ≥ 2``: ``r = ⌈log2 k⌉``, ``K = 2^{m+r}``, an output is ``y = (w << m) | u`` with ``w ∈ [0, 2^r)`` and
  ``u ∈ [0, t)``; with GF(2^r) arithmetic (an irreducible polynomial of degree r, items as field elements, z the
  generator) ``S_v = {((v·a) << m) | a : a ∈ [0, t)}`` (a read as a polynomial of degree < m), so ``y ∈ C_v`` iff
  ``u = h_v(w)``, ``h_v(w)_i = popcount((v·z^i) & w) mod 2``. For x ≠ v the rows ``(x⊕v)·z^i`` (i < m) are
  independent (a field has no zero divisors), so ``h_x(w) ⊕ h_v(w)`` is uniform on ``[0, t)`` for uniform w.
* ``m = 0`` (direct response): for small k or large ε no Hadamard design beats randomized response over the k
  items (GRR's ``(e^ε+k-2)/(e^ε-1)²`` is below every ``m``'s variance when ``k ≤ 5``, e.g.); then ``K = k``,
  ``C_v = {v}``, ``p = e^ε/(e^ε+k-1)``, ``q = 1/(e^ε+k-1)`` and the decode is a histogram.

Probabilities (m ≥ 1): ``P[y | x] = (t/K)·p`` on ``C_x`` and ``(t/K)·(1-p)/(t-1)`` off it with ``p =
e^ε/(e^ε+t-1)``: the worst-case ratio is e^ε exactly. The per-user variance at f = 0 of construction m is

    Var[f̂_v] = (q(1-q) + f(p-q)(1-p-q))/(p-q)²,   at f = 0:  (e^ε+t-1)²/((t-1)(e^ε-1)²)   (m ≥ 1),

which is OLH's variance at ``g = t``: within 1.08× of ``4e^ε/(e^ε-1)²`` when t can be the power of two nearest
``e^ε+1`` (worst at ``e^ε = √3`` between t = 2 and t = 4). It does not depend on the other items' frequencies,
so the inherited ``estimate`` and ``variance`` are exact.

Choice of m, and cost
---------------------
Cost model: a design's cost is its output space K (:func:`output_space`): K = k for direct response (decode = a
histogram), ``2^⌈log2(k+1)⌉`` for m = 1 and ``2^{m+⌈log2 k⌉}`` for m ≥ 2 (decode = one FWHT, O(K log K) time,
8·K bytes). K grows strictly with m, so "cheapest" means fewest rows. The client's cost (O(m) per report) and the
report (log2 K bits) follow K too. The admissible designs are ``m = 0, 1`` and every m ≥ 2 with ``2^m < k`` and
``K ≤ 2^26`` (:data:`MAX_LOG2_OUTPUTS`, the hard cap on K).

Default (:func:`choose_rows`): the cheapest admissible design whose variance at f = 0 is within 1.1×
(:data:`VARIANCE_TOLERANCE`) of ``4e^ε/(e^ε-1)²``; if none is, the one of least variance
(:func:`least_variance_rows`). ``rows=`` forces any admissible design. Within 1.1× means ``0.537·e^ε ≤ t-1 ≤
1.863·e^ε`` for m ≥ 1 and ``k - 2 ≤ 3.4·e^ε`` for direct response. Measured on ε = 0.05…10 (step 0.05,
``tests/protocols/frequency/test_hadamard.py``), every k ≤ 2^14 gets a design within 1.1× (the default reaches 1.09999× at k =
15,122, ε = 8.4, and 1.0991× at the tested k; the least-variance design reaches 1.0772×), never with a larger K
than the least-variance design; where the latter is within 1.1× the default usually saves a factor 2 in K, and
sometimes far more: k = 10,000 at ε = 8 takes direct response (K = 10,000, 1.0885×) instead of m = 12 (K = 2^26,
1.0254×); k = 16,384 at ε = 8 takes m = 11 (K = 2^25, 1.036×) instead of m = 12. Beyond k = 2^14 the cap limits
t at large ε and the default is the least-variance design (k = 10^5: up to 3.8× near ε = 8.9; k = 2^26 - 1: only
m ≤ 1 fits), never worse than m = 1 unless within 1.1×.

Decode memory is capped at the int64 histogram (8·K bytes, ≤ 512 MiB at K = 2^26), which the FWHT transforms in
place, plus bounded scratch: ``FWHT_CHUNK`` = 2^16 entries per butterfly slice and, for m ≥ 2, gather index arrays
of ``GATHER_CHUNK`` = 2^20 entries (24 MiB). Decode time and peak memory are measured by ``make bench`` (section
``frequency``), not quoted here.

Sampling (vectorised over users). m = 1: draw y0 uniform on [0, K); its parity ``popcount((x+1) & y0) mod 2`` says
whether y0 ∈ C_x; if that is not the half we want, flip the lowest set bit of x+1 — a bijection between the halves.
m ≥ 2: draw w uniform on [0, 2^r), keep ``u = h_x(w)`` w.p. p, else XOR it with a uniform value in [1, t) (uniform
over the t-1 others).

Decoding (one FWHT, O(K log K), for all items). With N the output histogram and ``W = H·N`` its Walsh–Hadamard
transform, ``1[y ∈ C_v] = (1/t)·Σ_{s ∈ S_v} H[s, y]``, so ``C_v = (1/t)·Σ_{s ∈ S_v} W[s]`` — for m = 1 the old
``(n + W[v+1])/2``; for m ≥ 2 a gather of k·t ≤ K entries of W. Then ``f̂_v = (C_v/n - q)/(p - q)`` (unbiased).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_category, check_int
from protocols.frequency._common import keep_probability, oracle_epsilon, report_vector, user_values
from protocols.frequency.direct import grr_perturb, grr_perturb_one

__all__ = ["HadamardResponse", "choose_rows", "fwht", "hadamard_entries", "least_variance_rows", "optimal_variance",
           "output_space"]

#: Largest supported domain (the m = 1 output space is then 2^26).
MAX_K = (1 << 26) - 1
#: Largest output space of a Hadamard design (K ≤ 2^26): the decode's int64 histogram, transformed in place, is
#: 8·K bytes = 512 MiB there (see "Cost" in the module docstring).
MAX_LOG2_OUTPUTS = 26
#: The default design is the cheapest one within this factor of the optimal variance (:func:`choose_rows`).
VARIANCE_TOLERANCE = 1.1
#: Items per slice of the m ≥ 2 gather, so that its three (items × t) int64 index arrays stay ≤ 3·8·2^20 B = 24 MiB.
GATHER_CHUNK = 1 << 20


def fwht(x: Any) -> np.ndarray:
    """Unnormalised Walsh–Hadamard transform along the last axis: ``out = x @ H_K`` (Sylvester order).

    ``K`` (the last dimension) must be a power of two. Vectorised butterflies: at stage h the array is viewed as
    ``(..., K/2h, 2, h)`` and each pair ``(u, w)`` becomes ``(u + w, u - w)``; log2(K) stages, O(K log K) work.
    Integer input stays integer (exact), float input stays float. The input is copied once; the stages run in
    place in slices of at most :data:`FWHT_CHUNK` entries (per leading row), so the scratch memory is bounded.
    """
    arr = np.array(x, copy=True)
    if arr.dtype.kind not in "iuf":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind == "u":
        arr = arr.astype(np.int64)
    _fwht_inplace(arr)
    return arr


#: Largest slice one butterfly step copies: the transform's scratch memory is this many entries, not K/2.
FWHT_CHUNK = 1 << 16


def _fwht_inplace(arr: np.ndarray) -> None:
    """:func:`fwht` in place on a C-contiguous int64/float array (scratch: ``FWHT_CHUNK`` entries per row)."""
    K = arr.shape[-1] if arr.ndim else 0
    if K < 1 or K & (K - 1):
        raise ValueError(f"the transform length must be a power of two, got {K}")
    flat = arr.reshape(-1, K)  # a view (arr is contiguous), so the butterflies write through
    h = 1
    while h < K:
        view = flat.reshape(flat.shape[0], K // (2 * h), 2, h)
        if h >= FWHT_CHUNK:  # long pairs of halves: one block at a time, sliced
            pieces = [(slice(b, b + 1), slice(j, j + FWHT_CHUNK)) for b in range(K // (2 * h))
                      for j in range(0, h, FWHT_CHUNK)]
        else:  # many short pairs: slice whole blocks
            step = FWHT_CHUNK // h
            pieces = [(slice(b, b + step), slice(None)) for b in range(0, K // (2 * h), step)]
        for blocks, cols in pieces:
            top = view[:, blocks, 0, cols]
            bottom = view[:, blocks, 1, cols]
            u = top.copy()
            top += bottom
            np.subtract(u, bottom, out=bottom)
        h *= 2


def _parity(v: np.ndarray) -> np.ndarray:
    """popcount(v) mod 2 for non-negative int64 values, elementwise."""
    if hasattr(np, "bitwise_count"):
        return (np.bitwise_count(v) & 1).astype(np.int64)
    v = v.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        v ^= v >> shift
    return v & 1


def hadamard_entries(rows: Any, cols: Any) -> np.ndarray:
    """``H[rows, cols] = (-1)^{popcount(rows & cols)}`` elementwise with broadcasting (int8 ±1)."""
    r = np.asarray(rows, dtype=np.int64)
    c = np.asarray(cols, dtype=np.int64)
    return (1 - 2 * _parity(r & c)).astype(np.int8)


def optimal_variance(epsilon: float) -> float:
    """``4e^ε/(e^ε-1)²``: the per-user variance of OUE/OLH at f = 0, the benchmark of the module docstring."""
    return 4.0 * math.exp(-epsilon) / (-math.expm1(-epsilon)) ** 2


# --- GF(2^r) arithmetic on int64 arrays (polynomials over GF(2) as bit masks) ----------------------------------------


def _polymulmod(a: int, b: int, poly: int, degree: int) -> int:
    out = 0
    while b:
        if b & 1:
            out ^= a
        b >>= 1
        a <<= 1
        if a >> degree & 1:
            a ^= poly
    return out


def _polygcd(a: int, b: int) -> int:
    while b:
        while a and a.bit_length() >= b.bit_length():
            a ^= b << (a.bit_length() - b.bit_length())
        a, b = b, a
    return a


@functools.lru_cache(maxsize=None)
def irreducible_polynomial(degree: int) -> int:
    """The smallest irreducible polynomial over GF(2) of the given degree (bit mask with bit ``degree`` set).

    Rabin's test: f of degree r is irreducible iff ``x^(2^r) ≡ x (mod f)`` and ``gcd(x^(2^(r/q)) - x, f) = 1``
    for every prime q dividing r.
    """
    degree = check_int(degree, "degree", minimum=1, maximum=62)
    primes = [q for q in range(2, degree + 1) if degree % q == 0 and all(q % d for d in range(2, q))]
    for low in range(1, 1 << degree, 2):
        poly = (1 << degree) | low
        x = 2 % poly if degree > 1 else 2 ^ poly  # the polynomial x reduced mod poly
        powers = [x]  # x^(2^i) mod poly, i = 0..degree
        for _ in range(degree):
            powers.append(_polymulmod(powers[-1], powers[-1], poly, degree))
        if powers[degree] != x:
            continue
        if all(_polygcd(poly, powers[degree // q] ^ x) == 1 for q in primes):
            return poly
    raise AssertionError(f"no irreducible polynomial of degree {degree}")  # pragma: no cover (one always exists)


def _times_z(c: np.ndarray, poly: int, degree: int) -> np.ndarray:
    """Multiply field elements by the generator z (shift, then reduce by the polynomial)."""
    c = c << 1
    return c ^ np.where((c >> degree) & 1 == 1, poly, 0)


def _log2_items(k: int) -> int:
    """⌈log2 k⌉ (at least 1): the bits of an item, the degree of the field of the m ≥ 2 designs."""
    return max(1, math.ceil(math.log2(k)))


def _design_pq(epsilon: float, k: int, rows: int) -> tuple[float, float]:
    """(p, q) of construction ``rows``: direct response's GRR pair (m = 0), else p = e^ε/(e^ε+t-1), q = 1/t."""
    if rows == 0:
        return keep_probability(epsilon, k - 1)
    t = 1 << rows
    return keep_probability(epsilon, t - 1)[0], 1.0 / t


def _design_variance(epsilon: float, k: int, rows: int) -> float:
    """Per-user variance at f = 0 of construction ``rows`` (0 = direct response, m ≥ 1: t = 2^m)."""
    p, q = _design_pq(epsilon, k, rows)
    return q * (1 - q) / (p - q) ** 2


def output_space(k: int, rows: int) -> int:
    """K, the number of possible reports of construction ``rows`` at domain size k: the decode's cost measure.

    ``k`` for direct response, ``2^⌈log2(k+1)⌉`` for m = 1 and ``2^{m+⌈log2 k⌉}`` for m ≥ 2 — strictly increasing
    in m, so the cheapest design is the one with the fewest rows.
    """
    if rows == 0:
        return k
    if rows == 1:
        return 1 << math.ceil(math.log2(k + 1))
    return 1 << (rows + _log2_items(k))


def _admissible_rows(k: int) -> list[int]:
    """Constructions available at domain size k: 0, 1 and every m ≥ 2 with 2^m < k and m + ⌈log2 k⌉ ≤ 26."""
    r = _log2_items(k)  # m < r gives 2^m < k
    return [0, 1] + [m for m in range(2, r) if m + r <= MAX_LOG2_OUTPUTS]


def least_variance_rows(epsilon: float, k: int) -> int:
    """The admissible construction of smallest per-user variance at f = 0, whatever its cost (ties: the smaller
    output space; m = 1 before direct response at equal variance)."""
    epsilon = oracle_epsilon(epsilon)
    k = check_int(k, "k", minimum=2, maximum=MAX_K)
    return min(_admissible_rows(k), key=lambda m: (_design_variance(epsilon, k, m), m != 1, m))


def choose_rows(epsilon: float, k: int) -> int:
    """The default construction: the cheapest admissible design (smallest :func:`output_space`) whose variance at
    f = 0 is within :data:`VARIANCE_TOLERANCE` of :func:`optimal_variance`; if none is, :func:`least_variance_rows`.
    """
    epsilon = oracle_epsilon(epsilon)
    k = check_int(k, "k", minimum=2, maximum=MAX_K)
    bound = VARIANCE_TOLERANCE * optimal_variance(epsilon)
    good = [m for m in _admissible_rows(k) if _design_variance(epsilon, k, m) <= bound]
    if good:
        return min(good, key=lambda m: output_space(k, m))
    return least_variance_rows(epsilon, k)


class HadamardResponse(FrequencyOracle):
    """Hadamard response over ``[0, k)``; a report is one int64 output ``y ∈ [0, K)`` (see the module docstring).

    ``rows`` (keyword-only) forces the construction: 0 = direct response, 1 = the paper's high-privacy HR, m ≥ 2 =
    support sets cut by m Hadamard rows (needs ``m ≤ ⌈log2 k⌉`` and ``m + ⌈log2 k⌉ ≤ 26``); by default the cheapest
    design within 1.1× of the optimal variance at this ε and k, else the one of least variance (:func:`choose_rows`).
    """

    def __init__(self, epsilon: float, k: int, *, rows: int | None = None) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2, maximum=MAX_K)
        r = _log2_items(self.k)
        if rows is None:
            rows = choose_rows(self.epsilon, self.k)
        rows = check_int(rows, "rows", minimum=0, maximum=MAX_LOG2_OUTPUTS)
        if rows >= 2 and rows > r:
            raise ValueError(f"rows must be <= ceil(log2 k) = {r} for k = {self.k}, got {rows}")
        if rows >= 2 and rows + r > MAX_LOG2_OUTPUTS:
            raise ValueError(f"rows + ceil(log2 k) must be <= {MAX_LOG2_OUTPUTS} (K <= 2^26), got {rows} + {r}")
        self.rows = rows
        #: Number of output classes per seed: a non-holder supports an item w.p. q = 1/t (m ≥ 1).
        self.t = 1 << rows if rows else self.k
        self.r = r
        self.K = output_space(self.k, rows)
        self.p, self.q = _design_pq(self.epsilon, self.k, rows)
        self._poly = irreducible_polynomial(r) if rows >= 2 else 0

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "rows": self.rows}

    # --- the support sets ---------------------------------------------------------------------------------------

    def _hash(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """m ≥ 2: ``h_x(w)``, bit i = popcount((x·z^i) & w) mod 2 (x, w int64 arrays, broadcast)."""
        c = np.asarray(x, dtype=np.int64)
        u = np.zeros(np.broadcast_shapes(c.shape, np.shape(w)), dtype=np.int64)
        for i in range(self.rows):
            u |= _parity(c & w) << i
            c = _times_z(c, self._poly, self.r)
        return u

    def in_support(self, reports: Any, value: int) -> np.ndarray:
        """Boolean mask: which reports lie in ``C_value`` (support the item ``value``)."""
        y = report_vector(reports, self.K)
        v = int(user_values(value, self.k)[0])
        if self.rows == 0:
            return y == v
        if self.rows == 1:
            return hadamard_entries(v + 1, y) == 1
        return (y & (self.t - 1)) == self._hash(np.int64(v), y >> self.rows)

    # --- client ----------------------------------------------------------------------------------------------------

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        x = user_values(values, self.k)
        n = x.shape[0]
        if self.rows == 0:
            return grr_perturb(x, self.k, self.p, rng)
        if self.rows == 1:
            row = x + 1
            y0 = rng.integers(0, self.K, size=n, dtype=np.int64)
            in_c = _parity(row & y0) == 0
            want_c = rng.random(n) < self.p
            lowest_bit = row & -row
            return np.where(in_c == want_c, y0, y0 ^ lowest_bit)
        w = rng.integers(0, 1 << self.r, size=n, dtype=np.int64)
        keep = rng.random(n) < self.p
        u = self._hash(x, w) ^ np.where(keep, 0, rng.integers(1, self.t, size=n, dtype=np.int64))
        return (w << self.rows) | u

    def privatize_one(self, value: Any, rng: np.random.Generator) -> int:
        """:meth:`privatize` of one user's item in Python integers: the same draws in the same order (every draw of
        the batch path is made, including the flip the batch computes for kept reports)."""
        x = check_category(value, self.k)
        if self.rows == 0:
            return grr_perturb_one(x, self.k, self.p, rng)
        if self.rows == 1:
            row = x + 1
            y0 = int(rng.integers(0, self.K, dtype=np.int64))
            in_c = (row & y0).bit_count() % 2 == 0
            want_c = rng.random() < self.p
            return y0 if in_c == want_c else y0 ^ (row & -row)
        w = int(rng.integers(0, 1 << self.r, dtype=np.int64))
        keep = rng.random() < self.p
        flip = int(rng.integers(1, self.t, dtype=np.int64))
        u, c = 0, x
        for i in range(self.rows):  # _hash of one (x, w): bit i = parity((x·z^i) & w)
            u |= ((c & w).bit_count() & 1) << i
            c <<= 1
            if (c >> self.r) & 1:
                c ^= self._poly
        return (w << self.rows) | (u if keep else u ^ flip)

    # --- server ----------------------------------------------------------------------------------------------------

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """``C_v = (1/t)·Σ_{s ∈ S_v} W[s]`` with W the FWHT of the output histogram (a histogram for m = 0).

        Memory: the int64 histogram (8·K bytes), transformed in place, plus ``FWHT_CHUNK`` scratch entries and, for
        m ≥ 2, index arrays of at most ``GATHER_CHUNK`` entries (items are gathered in slices).
        """
        y = report_vector(reports, self.K)
        hist = np.bincount(y, minlength=self.K).astype(np.int64, copy=False)
        if self.rows == 0:
            return hist
        _fwht_inplace(hist)
        transform = hist
        if self.rows == 1:
            return (y.shape[0] + transform[1 : self.k + 1]) // 2
        # S_v = {((v·a) << m) | a : a ∈ [0, t)}: the products v·a by doubling over the bits of a.
        out = np.empty(self.k, dtype=np.int64)
        step = max(1, GATHER_CHUNK // self.t)
        for lo in range(0, self.k, step):
            hi = min(self.k, lo + step)
            products = np.zeros((hi - lo, self.t), dtype=np.int64)
            c = np.arange(lo, hi, dtype=np.int64)
            for j in range(self.rows):
                half = 1 << j
                products[:, half : 2 * half] = products[:, :half] ^ c[:, None]
                c = _times_z(c, self._poly, self.r)
            products <<= self.rows
            products |= np.arange(self.t, dtype=np.int64)
            out[lo:hi] = transform[products].sum(axis=1) // self.t
        return out

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[y | value]``: ``(t/K)·p`` on ``C_value``, ``(t/K)·(1-p)/(t-1)`` off it (GRR's p, q for m = 0)."""
        inside = self.in_support(reports, value)
        if self.rows == 0:
            return np.where(inside, self.p, self.q)
        scale = self.t / self.K
        return np.where(inside, scale * self.p, scale * (1 - self.p) / (self.t - 1))
