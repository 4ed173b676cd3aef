"""Exact discrete sampling: the only randomness a released value may depend on (SPEC §3.0, *The release*).

A mechanism that releases an IEEE double computed from its input and a uniform draw leaks the input through *which*
doubles it can produce (Mironov, "On significance of the least significant bits for differential privacy", CCS 2012):
the privacy loss of such a report is unbounded whatever its real-valued ε. Every haarvest mechanism therefore
releases an **index on a public finite grid** (at most :data:`MAX_GRID` values, fixed by its public parameters),
drawn from a law whose probabilities are exact rationals — or, for the discrete Laplace and Gaussian, exact by
construction (Canonne, Kamath, Steinke, *The Discrete Gaussian for Differential Privacy*, NeurIPS 2020) — using only
exact uniform integers taken from the generator's raw 64-bit words by rejection (:func:`uniform_below`).

Input values are doubles too; a mechanism first rounds its input **randomly** to a public input grid (unbiased:
``E[grid value] = input``). That step needs no exactness: the law of the release given any input is a mixture of
the laws given grid inputs, and a mixture of distributions whose likelihood ratios are bounded by e^ε against every
other grid input keeps that bound (``P[y|x] ≤ max_i P[y|i] ≤ e^ε min_i P[y|i] ≤ e^ε P[y|x']``). So ε is a property
of the finite channel ``P[index | grid input]``, which tests enumerate exactly.

Devices pass a generator seeded from OS entropy (:func:`protocols.base.os_rng`), simulations a seeded one; the
samplers read its bit generator's raw words (``random_raw``), 64 bits at a time.
"""

from __future__ import annotations

import functools
import math
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "MAX_GRID",
    "uniform_below",
    "uniform_below_array",
    "ratio_weights",
    "ratio_within",
    "rational_epsilon",
    "randomized_round",
    "randomized_round_one",
    "discrete_laplace",
    "discrete_gaussian",
    "discrete_laplace_one",
    "discrete_gaussian_one",
    "WindowChannel",
]

#: The largest released set of one value: a report's index fits in 16 bits.
MAX_GRID = 1 << 16
_TWO64 = 1 << 64
#: Bits of the larger of the two integer weights of a ratio (:func:`ratio_weights`): e^ε is matched to 2^-40.
WEIGHT_BITS = 40
_DEC = Context(prec=80)


def uniform_below(rng: np.random.Generator, bound: int) -> int:
    """An exactly uniform integer in ``[0, bound)`` (``1 ≤ bound < 2^63``): a raw 64-bit word r is accepted when
    ``r ≥ 2^64 mod bound`` (the accepted words are a whole number of copies of ``[0, bound)``), then ``r mod bound``."""
    reject = _TWO64 % bound
    raw = rng.bit_generator.random_raw
    while True:
        r = int(raw())
        if r >= reject:
            return r % bound


def uniform_below_array(rng: np.random.Generator, bound: Any, size: int) -> np.ndarray:
    """:func:`uniform_below` for ``size`` draws (``bound`` an int or an int array of that size): the same words in
    the same order as ``size`` scalar calls when no word is rejected (at most one word in 2^8 at the bounds used here, all < 2^56); a
    rejected entry is drawn again after the batch, so a batch of one draws exactly as the scalar call does."""
    b = np.broadcast_to(np.asarray(bound, dtype=np.uint64), (size,))
    reject = (np.uint64(0) - b) % b  # 2^64 mod b, in wrapping uint64 arithmetic
    out = np.empty(size, dtype=np.uint64)
    todo = np.arange(size)
    raw = rng.bit_generator.random_raw
    while todo.size:
        r = np.asarray(raw(todo.size), dtype=np.uint64)
        ok = r >= reject[todo]
        out[todo[ok]] = r[ok] % b[todo[ok]]
        todo = todo[~ok]
    return out.astype(np.int64)


def ratio_within(high: int, low: int, epsilon: float) -> bool:
    """Exactly whether ``high/low ≤ e^ε`` (ε the double as given): e^ε to 80 significant digits, correctly rounded,
    with a margin of 10^-70 relative (e^ε is irrational for rational ε ≠ 0, so equality never occurs)."""
    bound = Decimal(epsilon).exp(_DEC)
    return Decimal(high) / Decimal(low) * (1 + Decimal(10) ** -70) <= bound if low > 0 else False


@functools.lru_cache(maxsize=1024)
def ratio_weights(epsilon: float) -> tuple[int, int]:
    """Integer weights ``(H, L)`` with ``H = 2^40``, ``L = ⌈H·e^{-ε}⌉``: ``H/L ≤ e^ε`` exactly (checked with
    :func:`ratio_within`) and ``H/L > e^ε(1 − 1/L)`` — the high/low weights of a two-level channel, whose ε is
    ``ln(H/L) ≤ ε``. (``L ≥ 2266`` for ε ≤ 20, so the ratio is within 0.05 % of e^ε there.)"""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    high = 1 << WEIGHT_BITS
    low = int((Decimal(high) / Decimal(epsilon).exp(_DEC)).to_integral_value(rounding="ROUND_CEILING"))
    while not ratio_within(high, low, epsilon):  # a guard against the margin of ratio_within
        low += 1
    if low >= high:
        raise ValueError(f"epsilon {epsilon!r} is too small for a 2^-{WEIGHT_BITS} weight grid")
    return high, low


def rational_epsilon(epsilon: float, bits: int = 32) -> Fraction:
    """ε rounded **down** to a multiple of 2^-bits (> 0): a rational the exact samplers use, never above ε."""
    num = math.floor(epsilon * (1 << bits))
    while Fraction(num, 1 << bits) > Fraction(epsilon):
        num -= 1
    if num <= 0:
        raise ValueError(f"epsilon {epsilon!r} is below 2^-{bits}")
    return Fraction(num, 1 << bits)


def randomized_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each real ``x ≥ 0`` to ``⌊x⌋`` or ``⌊x⌋ + 1`` with ``P[⌊x⌋ + 1] = x − ⌊x⌋`` (so ``E = x``): one uniform double
    per value. Not an exact law — it need not be (module docstring): it only chooses the grid input."""
    base = np.floor(x)
    return (base + (rng.random(x.shape) < x - base)).astype(np.int64)


def randomized_round_one(x: float, rng: np.random.Generator) -> int:
    """:func:`randomized_round` of one value, drawing the same uniform."""
    base = math.floor(x)
    return base + (1 if rng.random() < x - base else 0)


# ------------------------------------------------------------------ Canonne–Kamath–Steinke samplers (vectorised)

def _bernoulli_exp_unit(rng: np.random.Generator, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(−γ)) for rationals ``γ = num/den ∈ [0, 1]`` (CKS 2020, Algorithm 1, first case): K ← 1; while
    Bernoulli(γ/K): K ← K + 1; return K odd. Each Bernoulli(γ/K) is ``uniform_below(den·K) < num``: exact."""
    n = num.size
    k = np.ones(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        hit = uniform_below_array(rng, den[active] * k[active], active.size) < num[active]
        k[active[hit]] += 1
        active = active[hit]
    return (k % 2) == 1


def _bernoulli_exp(rng: np.random.Generator, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(−num/den)) for any rational ≥ 0 (CKS Algorithm 1): ⌊γ⌋ draws of Bernoulli(e^-1), all 1, then
    Bernoulli(exp(−(γ − ⌊γ⌋)))."""
    n = num.size
    whole = num // den
    out = np.ones(n, dtype=bool)
    pending = np.flatnonzero(whole > 0)
    left = whole.copy()
    while pending.size:
        ok = _bernoulli_exp_unit(rng, np.ones(pending.size, dtype=np.int64), np.ones(pending.size, dtype=np.int64))
        out[pending[~ok]] = False
        left[pending] -= 1
        pending = pending[ok & (left[pending] > 0)]
    frac = num - whole * den
    rest = np.flatnonzero(out & (frac > 0))  # exp(−0) = 1: no draw
    if rest.size:
        out[rest] = _bernoulli_exp_unit(rng, frac[rest], den[rest])
    return out


def _bernoulli_exp_unit_one(rng: np.random.Generator, num: int, den: int) -> bool:
    """:func:`_bernoulli_exp_unit` of one γ, in Python integers: the same draws."""
    k = 1
    while uniform_below(rng, den * k) < num:
        k += 1
    return k % 2 == 1


def _bernoulli_exp_one(rng: np.random.Generator, num: int, den: int) -> bool:
    """:func:`_bernoulli_exp` of one γ, in Python integers: the same draws."""
    whole, frac = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_unit_one(rng, 1, 1):
            return False
    return _bernoulli_exp_unit_one(rng, frac, den) if frac else True


def discrete_laplace(rng: np.random.Generator, scale: Fraction, size: int) -> np.ndarray:
    """``size`` draws of the discrete Laplace law ``P[Y = y] ∝ exp(−|y|/scale)`` on the integers, exactly (CKS 2020,
    Algorithm 2, with ``scale = t/s``): X = U + t·V with U uniform on [0, t) accepted w.p. exp(−U/t) and V geometric
    (count of Bernoulli(e^-1) successes) is geometric with ratio e^{-1/t}; Y = ±⌊X/s⌋, rejecting −0."""
    t, s = scale.numerator, scale.denominator
    out = np.zeros(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        m = todo.size
        u = uniform_below_array(rng, t, m)
        keep = _bernoulli_exp_unit(rng, u, np.full(m, t, dtype=np.int64))
        idx, u = todo[keep], u[keep]
        v = np.zeros(idx.size, dtype=np.int64)
        going = np.arange(idx.size)
        while going.size:  # V: Bernoulli(e^-1) successes before the first failure
            ones = np.ones(going.size, dtype=np.int64)
            more = _bernoulli_exp_unit(rng, ones, ones)
            v[going[more]] += 1
            going = going[more]
        y = (u + t * v) // s
        sign = uniform_below_array(rng, 2, idx.size)
        good = ~((sign == 1) & (y == 0))
        out[idx[good]] = np.where(sign[good] == 1, -y[good], y[good])
        done = np.zeros(size, dtype=bool)
        done[idx[good]] = True
        todo = todo[~done[todo]]
    return out


def discrete_gaussian(rng: np.random.Generator, sigma2: int, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian ``P[Y = y] ∝ exp(−y²/(2σ²))`` on the integers for an integer σ²,
    exactly (CKS 2020, Algorithm 3): Y from the discrete Laplace of scale ``t = ⌊σ⌋ + 1``, accepted with probability
    ``exp(−(|Y| − σ²/t)²/(2σ²))`` = Bernoulli(exp(−(|Y|t − σ²)²/(2σ²t²))), a rational exponent."""
    t = math.isqrt(sigma2) + 1
    out = np.zeros(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        y = discrete_laplace(rng, Fraction(t), todo.size)
        num = (np.abs(y) * t - sigma2) ** 2
        den = np.full(todo.size, 2 * sigma2 * t * t, dtype=np.int64)
        ok = _bernoulli_exp(rng, num, den)
        out[todo[ok]] = y[ok]
        todo = todo[~ok]
    return out


def discrete_laplace_one(rng: np.random.Generator, scale: Fraction) -> int:
    """One draw of :func:`discrete_laplace` in Python integers (a device's one-value path): the same draws."""
    t, s = scale.numerator, scale.denominator
    while True:
        u = uniform_below(rng, t)
        if not _bernoulli_exp_unit_one(rng, u, t):
            continue
        v = 0
        while _bernoulli_exp_unit_one(rng, 1, 1):
            v += 1
        y = (u + t * v) // s
        if uniform_below(rng, 2) == 1:
            if y == 0:
                continue
            return -y
        return y


def discrete_gaussian_one(rng: np.random.Generator, sigma2: int) -> int:
    """One draw of :func:`discrete_gaussian` in Python integers: the same draws."""
    t = math.isqrt(sigma2) + 1
    while True:
        y = discrete_laplace_one(rng, Fraction(t))
        if _bernoulli_exp_one(rng, (abs(y) * t - sigma2) ** 2, 2 * sigma2 * t * t):
            return y


# ------------------------------------------------------------------ the window channel

class WindowChannel:
    """The two-level channel behind PM, PDP and Square Wave (SPEC §3.0): ``N`` output cells, an input position
    ``s ∈ {0, …, N − K}``, weight ``H`` on the K cells ``s … s+K−1`` and ``L`` on the others (``H/L ≤ e^ε`` from
    :func:`ratio_weights`). Every position has the same total ``W = K·H + (N − K)·L``, so

        P[j | s] = H/W on the window, L/W off it,       max_{s, s', j} P[j|s]/P[j|s'] = H/L ≤ e^ε.

    One exact draw u ∈ [0, W) picks the cell: ``u < K·H`` → ``s + ⌊u/H⌋``; else ``j = ⌊(u − K·H)/L⌋``, skipping the
    window (``j + K`` when ``j ≥ s``).

    Moments (exact): ``E[j | s] = A + B·s`` with ``B = (H − L)K/W``, ``A = (L·N(N−1)/2 + (H − L)K(K−1)/2)/W``, and
    ``E[j² | s] = (L·S(0, N) + (H − L)·S(s, s+K))/W`` with ``S(a, b) = Σ_{a ≤ j < b} j²``.
    """

    def __init__(self, cells: int, window: int, epsilon: float) -> None:
        if not (1 <= window < cells <= MAX_GRID):
            raise ValueError(f"a window channel needs 1 <= window < cells <= {MAX_GRID}, got {window}, {cells}")
        self.cells, self.window = cells, window
        self.high, self.low = ratio_weights(epsilon)
        self.positions = cells - window + 1
        self.inside = window * self.high
        self.total = self.inside + (cells - window) * self.low
        w = Fraction(self.total)
        self.slope = Fraction((self.high - self.low) * window) / w
        self.intercept = (Fraction(self.low * cells * (cells - 1), 2)
                          + Fraction((self.high - self.low) * window * (window - 1), 2)) / w

    @property
    def epsilon(self) -> float:
        """``ln(H/L)``: the channel's exact ε (≤ the ε it was built for)."""
        return math.log(self.high / self.low)

    def sample_one(self, position: int, rng: np.random.Generator) -> int:
        u = uniform_below(rng, self.total)
        if u < self.inside:
            return position + u // self.high
        j = (u - self.inside) // self.low
        return j + self.window if j >= position else j

    def sample(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        u = uniform_below_array(rng, self.total, positions.size)
        inside = u < self.inside
        j = np.where(inside, 0, (u - self.inside) // self.low)
        return np.where(inside, positions + u // self.high, np.where(j >= positions, j + self.window, j))

    def weights(self, position: int) -> np.ndarray:
        """The exact integer weights of the N cells at ``position`` (divide by :attr:`total`)."""
        w = np.full(self.cells, self.low, dtype=np.int64)
        w[position:position + self.window] = self.high
        return w

    def mean(self, positions: Any) -> np.ndarray:
        return float(self.intercept) + float(self.slope) * np.asarray(positions, dtype=float)

    def second_moment(self, positions: Any) -> np.ndarray:
        s = np.asarray(positions, dtype=float)
        k = self.window

        def squares(a: Any, b: Any) -> Any:  # Σ_{a ≤ j < b} j²
            return ((b - 1) * b * (2 * b - 1) - (a - 1) * a * (2 * a - 1)) / 6.0

        return (self.low * squares(0.0, float(self.cells)) + (self.high - self.low) * squares(s, s + k)) / self.total
