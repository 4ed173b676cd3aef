"""RAPPOR (Erlingsson, Pihur & Korolova, "RAPPOR: randomized aggregatable privacy-preserving ordinal response",
ACM CCS 2014), SPEC §3.9.

Client (cohort c ∈ [m] drawn for life): the value is hashed into a Bloom filter B of ``num_bits`` bits with
``num_hashes`` = h cohort-specific hash functions (SHA-256 of cohort ‖ index ‖ value). PRR, memoized per value:
B'_i = 1 w.p. f/2, 0 w.p. f/2, B_i w.p. 1 - f — its randomness derived from HMAC-SHA256(secret, value), so no
table is needed. IRR, fresh per report: S_i = 1 w.p. q if B'_i = 1, p if B'_i = 0.

Privacy (paper, §4): ε∞ = 2h ln((1 - f/2)/(f/2)); one report is ε1 = h ln(q*(1 - p*)/(p*(1 - q*))) with
q* = P[S_i = 1 | B_i = 1] = (f/2)(p + q) + (1 - f) q and p* = P[S_i = 1 | B_i = 0] = (f/2)(p + q) + (1 - f) p.

Decoder (paper, §4: a regression of the de-noised bit counts on the candidates' Bloom bits; the paper selects
candidates with the Lasso first, here the candidate list is given). Per cohort c with N_c reports and reported-bit
counts c_{c,i}, the de-noised count of true Bloom bits is

    t̂_{c,i} = (c_{c,i} - (p + (q - p) f/2) N_c) / ((1 - f)(q - p)),   E[t̂_{c,i}] = T_{c,i}

(T_{c,i}: how many of the cohort's users have Bloom bit i set). Let X_c (num_bits × K) be the cohort's Bloom design,
X_c[i, v] = 1 when candidate v sets bit i in cohort c (≤ h ones per column). Cohorts are drawn uniformly and
independently of the values, so given the cohort sizes the cohort's value counts satisfy E[N_{c,v}] = N_c π_v
(π: the population's frequencies), and the de-noised bit *proportions* y_c = t̂_c / N_c satisfy E[y_c] = X_c π for
every non-empty cohort. Stacking them, E[y] = X π with X = [X_c]_c ((m'·num_bits) × K over the m' non-empty
cohorts), and any left inverse L of X (L X = I) gives an unbiased estimate L y of π. (The expectation is over the
cohort draw too; for one fixed assignment of users to cohorts it is exact when each cohort holds the population's
mix, which is what the exact-expectation tests use.)

* ``method="lstsq"`` (the default): ordinary least squares π̂ = (XᵀX)⁻¹ Xᵀ y, each non-empty cohort weighted
  equally (with random cohorts their sizes differ by O(√(N/m)), so this is close to the variance-weighted fit).
  Unbiased whenever X has full column rank K; then E[π̂] = π exactly and Σ_v π̂_v estimates Σ_v π_v = 1 (the
  estimates may be negative; clip-and-normalise is the post-processing). The Gram matrix G = XᵀX = Σ_c X_cᵀX_c
  is built from the sparse X (each candidate sets ≤ h bits per cohort), Cholesky-factorised once and cached per
  (candidates, non-empty cohorts), so a round costs the bit counts, one sparse Xᵀy and two triangular solves.
  When X is rank-deficient (K > m·num_bits, or candidates whose Bloom bits coincide in every cohort) no unbiased
  estimator of π exists; the decoder then returns the minimum-norm least-squares solution π̂ = G⁺ Xᵀ y (eigenvalues
  of G below 1e-10 · its largest treated as zero), which is unbiased for the identifiable projection:
  E[π̂] = G⁺G π, the orthogonal projection of π onto the row space of X. Linear statistics aᵀπ with a in that row
  space stay unbiased — e.g. the total Σ_v π_v when every candidate sets the same number of distinct bits per
  cohort (always so for h = 1). :meth:`RAPPOR.design_rank` tells which case applies.
* ``method="nnls"``: the same least-squares fit constrained to π ≥ 0 (scipy.optimize.nnls on the K × K square
  root of G). Consistent (it converges to π as N grows with the design identifiable) and non-negative, but biased:
  clipping the many near-zero candidates at 0 pushes the total above 1, the more so the more candidates.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg
import scipy.sparse
from scipy.optimize import brentq, nnls

from protocols.base import check_categories, check_int
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol
from protocols.longitudinal.chains import check_budget_pair
from protocols.longitudinal.grr import check_category
from protocols.longitudinal.memo import encode_value
from protocols.longitudinal.prf import prf_uniform

__all__ = ["RAPPOR", "RAPPORClient", "RapporReports", "bloom_indices"]

_STREAM_PRR = 401
_BLOOM_DOMAIN = b"haarvest/rappor-bloom/v1\x00"
_METHODS = ("lstsq", "nnls")
_RANK_TOL = 1e-10  # eigenvalues (Cholesky pivots) of XᵀX below this × the largest count as zero
_CACHE_SIZE = 4


class _Design(NamedTuple):
    """The stacked Bloom design of one (candidates, non-empty cohorts) pair and its factorisation."""

    x: scipy.sparse.csr_matrix  # (m'·num_bits, K): X, one block of rows per non-empty cohort
    chol: np.ndarray | None  # lower Cholesky factor L of G = XᵀX (full column rank)
    eigvals: np.ndarray | None  # rank-deficient: the r positive eigenvalues of G ...
    eigvecs: np.ndarray | None  # ... and their eigenvectors (K, r)
    rank: int


def _cached(cache: dict[Any, Any], key: Any, build: Any) -> Any:
    if key not in cache:
        if len(cache) >= _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[key] = build()
    return cache[key]


def _cache_key(candidates: tuple[Any, ...]) -> tuple[Any, ...]:
    """A candidate list as a cache key: ``(1,) == (1.0,)`` in Python but the two encode to different Bloom bits
    (:func:`encode_value`), so the key carries each candidate's type too."""
    return candidates, tuple(map(type, candidates))


class RapporReports(NamedTuple):
    """A batch of RAPPOR reports: each user's cohort (n,) and reported bits (n, num_bits) uint8."""

    cohorts: np.ndarray
    bits: np.ndarray


def _prob(x: Any, name: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a probability, got {x!r}") from None
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")
    return v


def bloom_indices(value_bytes: bytes, cohort: int, num_bits: int, num_hashes: int) -> list[int]:
    """The h Bloom bit positions of an encoded value in a cohort: SHA-256(domain ‖ cohort ‖ j ‖ value) mod num_bits."""
    out = []
    for j in range(num_hashes):
        digest = hashlib.sha256(
            _BLOOM_DOMAIN + int(cohort).to_bytes(4, "big") + j.to_bytes(2, "big") + bytes(value_bytes)
        ).digest()
        out.append(int.from_bytes(digest[:8], "big") % num_bits)
    return out


class RAPPOR(MemoizedProtocol):
    """RAPPOR with Bloom filter size ``num_bits`` (the paper's k), ``num_hashes`` (h), ``num_cohorts`` (m), f, p, q.

    ``domain_size`` (optional) declares the candidate values 0..domain_size-1 used by the fleet simulator and as
    the decoder's default candidate list; device clients accept any encodable value (int, str, bytes) otherwise.
    """

    name = "RAPPOR"

    def __init__(
        self,
        num_bits: int = 128,
        num_hashes: int = 2,
        num_cohorts: int = 32,
        f: float = 0.5,
        p: float = 0.5,
        q: float = 0.75,
        domain_size: int | None = None,
    ) -> None:
        self.num_bits = check_int(num_bits, "num_bits", 1)
        self.num_hashes = check_int(num_hashes, "num_hashes", 1, self.num_bits)
        self.num_cohorts = check_int(num_cohorts, "num_cohorts", 1)
        self.f, self.p, self.q = _prob(f, "f"), _prob(p, "p"), _prob(q, "q")
        if not 0.0 < self.f < 1.0:
            raise ValueError(f"f must lie in (0, 1) (f = 0 gives no permanent privacy, f = 1 no signal), got {f}")
        if not self.p < self.q:
            raise ValueError(f"RAPPOR needs p < q (q is the IRR's P[S=1 | B'=1]), got p={p}, q={q}")
        self.domain_size = None if domain_size is None else check_int(domain_size, "domain_size", 1)
        self.epsilon_inf = 2 * self.num_hashes * math.log((1 - self.f / 2) / (self.f / 2))
        q_star = 0.5 * self.f * (self.p + self.q) + (1 - self.f) * self.q
        p_star = 0.5 * self.f * (self.p + self.q) + (1 - self.f) * self.p
        self.q_star, self.p_star = q_star, p_star
        self.epsilon_1 = self.num_hashes * math.log(q_star * (1 - p_star) / (p_star * (1 - q_star)))

    @classmethod
    def from_budgets(
        cls,
        epsilon_inf: float,
        epsilon_1: float,
        num_bits: int = 128,
        num_hashes: int = 2,
        num_cohorts: int = 32,
        domain_size: int | None = None,
    ) -> RAPPOR:
        """RAPPOR with the given (ε∞, ε1): f = 2/(1 + e^{ε∞/(2h)}) and a symmetric IRR p = 1 - q, q solved
        numerically (ε1 grows from 0 at q = 1/2 to ε∞ at q = 1)."""
        e_inf, e_1 = check_budget_pair(epsilon_inf, epsilon_1)
        h = check_int(num_hashes, "num_hashes", 1)
        f = 2.0 / (1.0 + math.exp(e_inf / (2 * h)))

        def gap(q: float) -> float:
            p = 1.0 - q
            q_star = 0.5 * f * (p + q) + (1 - f) * q
            p_star = 0.5 * f * (p + q) + (1 - f) * p
            return h * math.log(q_star * (1 - p_star) / (p_star * (1 - q_star))) - e_1

        q = brentq(gap, 0.5 + 1e-12, 1.0 - 1e-12, xtol=1e-15, rtol=1e-15)
        return cls(num_bits, h, num_cohorts, f, 1.0 - q, q, domain_size)

    def params(self) -> dict[str, Any]:
        return {
            "num_bits": self.num_bits,
            "num_hashes": self.num_hashes,
            "num_cohorts": self.num_cohorts,
            "f": self.f,
            "p": self.p,
            "q": self.q,
            "domain_size": self.domain_size,
        }

    @property
    def n_slots(self) -> int:
        if self.domain_size is None:
            raise ValueError("the fleet simulator needs RAPPOR(domain_size=...)")
        return self.domain_size

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """ε∞ per distinct value reported; infinite for an unbounded domain without ``n_distinct``."""
        if n_distinct is None and self.domain_size is None:
            return math.inf
        return super().longitudinal_bound(n_distinct)

    @property
    def irr_input_epsilon(self) -> float:
        """num_bits · max(ln(q/p), ln((1-p)/(1-q))): every PRR bit may differ between two memo entries."""
        per_bit = [math.log(self.q / self.p) if self.p > 0 else math.inf]
        per_bit.append(math.log((1 - self.p) / (1 - self.q)) if self.q < 1 else math.inf)
        return self.num_bits * max(per_bit)

    def memo_slots(self, values: Any, **device: Any) -> list[Any]:
        if device:
            raise ValueError(f"RAPPOR memo slots depend only on the values, got {sorted(device)}")
        return [encode_value(v.item() if isinstance(v, np.generic) else v) for v in list(values)]

    def _check_values(self, values: Any) -> np.ndarray:
        arr = np.asarray(values)
        if self.domain_size is None:
            raise ValueError("the fleet simulator needs RAPPOR(domain_size=...)")
        return check_categories(arr, self.domain_size)

    def bloom_table(self, candidates: tuple[Any, ...]) -> np.ndarray:
        """(num_cohorts, len(candidates), num_bits) bool: the Bloom filter of every candidate in every cohort.

        Cached per protocol instance for the last few candidate lists (building it hashes m·K values).
        """
        cache: dict[Any, np.ndarray] = self.__dict__.setdefault("_bloom_cache", {})
        return _cached(cache, _cache_key(candidates), lambda: self._build_bloom_table(candidates))

    def _build_bloom_table(self, candidates: tuple[Any, ...]) -> np.ndarray:
        table = np.zeros((self.num_cohorts, len(candidates), self.num_bits), dtype=bool)
        for j, cand in enumerate(candidates):
            vb = encode_value(cand)
            for c in range(self.num_cohorts):
                table[c, j, bloom_indices(vb, c, self.num_bits, self.num_hashes)] = True
        table.setflags(write=False)
        return table

    def _default_candidates(self) -> tuple[int, ...]:
        if self.domain_size is None:
            raise ValueError("give the decoder candidates, or declare RAPPOR(domain_size=...)")
        return tuple(range(self.domain_size))

    def prr_bits(self, bloom: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """B' from uniforms: 1 if u < f/2, 0 if f/2 ≤ u < f, else the Bloom bit."""
        return np.where(uniforms < self.f / 2, True, np.where(uniforms < self.f, False, bloom))

    def irr_bits(self, prr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """S: 1 w.p. q where B' = 1, w.p. p where B' = 0 (fresh)."""
        return (rng.random(prr.shape) < np.where(prr, self.q, self.p)).astype(np.uint8)

    def _init_fleet(self, fleet: FleetState, rng: np.random.Generator, **fixed: Any) -> None:
        cohorts = fixed.pop("cohorts", None)
        if fixed:
            raise ValueError(f"unknown fleet parameters {sorted(fixed)}")
        if cohorts is None:
            fleet.aux["cohorts"] = rng.integers(0, self.num_cohorts, size=fleet.n)
        else:
            c = np.broadcast_to(np.asarray(cohorts, dtype=np.int64), (fleet.n,)).copy()
            if c.min() < 0 or c.max() >= self.num_cohorts:
                raise ValueError(f"cohorts must lie in [0, {self.num_cohorts})")
            fleet.aux["cohorts"] = c

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[RapporReports, np.ndarray]:
        v = self._check_fleet_values(values, fleet)
        cohorts = fleet.aux["cohorts"]
        bloom = self.bloom_table(self._default_candidates())[cohorts, v]
        cells = v[:, None] * self.num_bits + np.arange(self.num_bits)[None, :]
        prr = self.prr_bits(bloom, prf_uniform(fleet.keys[:, None], cells, _STREAM_PRR))
        fleet.rounds += 1
        return RapporReports(cohorts.copy(), self.irr_bits(prr, rng)), self._charge(fleet, v)

    def denoised_bit_counts(self, reports: RapporReports) -> tuple[np.ndarray, np.ndarray]:
        """(t̂ (m, num_bits), N_c (m,)): unbiased per-cohort counts of true Bloom bits (module docstring)."""
        cohorts = np.asarray(reports.cohorts, dtype=np.int64).ravel()
        bits = np.asarray(reports.bits)
        if bits.ndim != 2 or bits.shape != (cohorts.size, self.num_bits):
            raise ValueError(f"bits must have shape ({cohorts.size}, {self.num_bits}), got {bits.shape}")
        if cohorts.size == 0:
            raise ValueError("cannot estimate frequencies from zero reports")
        if cohorts.min() < 0 or cohorts.max() >= self.num_cohorts:
            raise ValueError(f"cohorts must lie in [0, {self.num_cohorts})")
        n_c = np.bincount(cohorts, minlength=self.num_cohorts)
        onehot = scipy.sparse.csr_matrix(
            (np.ones(cohorts.size, dtype=np.int64), (cohorts, np.arange(cohorts.size))),
            shape=(self.num_cohorts, cohorts.size),
        )
        counts = np.asarray(onehot @ bits.astype(np.int64, copy=False))  # empty cohorts stay 0
        return self.denoise_counts(counts, n_c), n_c

    def denoise_counts(self, counts: Any, n_c: Any) -> np.ndarray:
        """t̂ = (c - (p + (q - p) f/2) N_c) / ((1 - f)(q - p)): reported-bit counts c (m, num_bits), sizes N_c (m,)."""
        counts = np.asarray(counts, dtype=float)
        n_c = np.asarray(n_c, dtype=float)
        if counts.shape != (self.num_cohorts, self.num_bits) or n_c.shape != (self.num_cohorts,):
            raise ValueError(f"counts must have shape ({self.num_cohorts}, {self.num_bits}) and n_c "
                             f"({self.num_cohorts},), got {counts.shape} and {n_c.shape}")
        base = self.p + (self.q - self.p) * self.f / 2
        return (counts - base * n_c[:, None]) / ((1 - self.f) * (self.q - self.p))

    def _candidates(self, candidates: Any) -> tuple[Any, ...]:
        cands = self._default_candidates() if candidates is None else tuple(
            c.item() if isinstance(c, np.generic) else c for c in candidates
        )
        if not cands:
            raise ValueError("at least one candidate is needed")
        return cands

    def _design(self, cands: tuple[Any, ...], present: tuple[int, ...]) -> _Design:
        """X over the ``present`` cohorts and G = XᵀX factorised (Cholesky, or eigh when rank-deficient); cached."""
        cache: dict[Any, _Design] = self.__dict__.setdefault("_design_cache", {})
        return _cached(cache, (_cache_key(cands), present), lambda: self._build_design(cands, present))

    def _build_design(self, cands: tuple[Any, ...], present: tuple[int, ...]) -> _Design:
        table = self.bloom_table(cands)[list(present)]  # (m', K, bits)
        block, cand, bit = np.nonzero(table)
        x = scipy.sparse.csr_matrix(
            (np.ones(block.size), (block * self.num_bits + bit, cand)),
            shape=(len(present) * self.num_bits, len(cands)),
        )
        gram = np.asarray((x.T @ x).todense())
        scale = float(np.max(np.diag(gram)))  # ≥ 1: every candidate sets a bit in every cohort
        try:
            chol = scipy.linalg.cholesky(gram, lower=True, check_finite=False)
            if float(np.min(np.diag(chol))) ** 2 > _RANK_TOL * scale:
                return _Design(x, chol, None, None, len(cands))
        except np.linalg.LinAlgError:
            pass
        lam, vec = scipy.linalg.eigh(gram, check_finite=False)
        keep = lam > _RANK_TOL * float(lam[-1])
        return _Design(x, None, lam[keep], vec[:, keep], int(keep.sum()))

    def design_rank(self, candidates: Any = None, cohorts: Any = None) -> int:
        """Rank of the stacked Bloom design X for these candidates over ``cohorts`` (default: all); the default
        decoder is unbiased exactly when this equals the number of candidates (module docstring)."""
        present = tuple(range(self.num_cohorts)) if cohorts is None else tuple(sorted({int(c) for c in cohorts}))
        if not present or present[0] < 0 or present[-1] >= self.num_cohorts:
            raise ValueError(f"cohorts must be a non-empty subset of [0, {self.num_cohorts})")
        return self._design(self._candidates(candidates), present).rank

    def estimate_round(self, reports: RapporReports, candidates: Any = None, method: str = "lstsq") -> np.ndarray:
        """Frequencies of the candidates (default 0..domain_size-1): ``"lstsq"`` (default) unbiased least squares
        (minimum-norm when the design is rank-deficient), ``"nnls"`` non-negative and biased (module docstring)."""
        return self.decode_bit_counts(*self.denoised_bit_counts(reports), candidates, method)

    def decode_bit_counts(
        self, t_hat: Any, n_c: Any, candidates: Any = None, method: str = "lstsq"
    ) -> np.ndarray:
        """The linear decoder of :meth:`estimate_round` applied to de-noised bit counts t̂ (m, num_bits) and cohort
        sizes N_c (m,): exact expected counts give back the true frequencies (``"lstsq"``, full rank)."""
        if method not in _METHODS:
            raise ValueError(f"method must be 'lstsq' (unbiased, the default) or 'nnls', got {method!r}")
        cands = self._candidates(candidates)
        t_hat = np.asarray(t_hat, dtype=float)
        n_c = np.asarray(n_c, dtype=float)
        if t_hat.shape != (self.num_cohorts, self.num_bits) or n_c.shape != (self.num_cohorts,):
            raise ValueError(f"t_hat must have shape ({self.num_cohorts}, {self.num_bits}) and n_c "
                             f"({self.num_cohorts},), got {t_hat.shape} and {n_c.shape}")
        if np.any(n_c < 0) or not np.any(n_c > 0):
            raise ValueError("cohort sizes must be non-negative with at least one report")
        present = np.flatnonzero(n_c > 0)
        design = self._design(cands, tuple(int(c) for c in present))
        y = (t_hat[present] / n_c[present, None]).ravel()  # de-noised bit proportions, E[y] = X π
        rhs = design.x.T @ y
        if method == "lstsq":
            if design.chol is not None:
                return scipy.linalg.cho_solve((design.chol, True), rhs, check_finite=False)
            return design.eigvecs @ ((design.eigvecs.T @ rhs) / design.eigvals)
        # NNLS on a square root A of G (AᵀA = G, Aᵀb = Xᵀy): same objective as ||Xπ - y||², K columns, ≤ K rows
        if design.chol is not None:
            a = design.chol.T
            b = scipy.linalg.solve_triangular(design.chol, rhs, lower=True, check_finite=False)
        else:
            root = np.sqrt(design.eigvals)
            a = root[:, None] * design.eigvecs.T
            b = (design.eigvecs.T @ rhs) / root
        return nnls(a, b, maxiter=50 * len(cands))[0]


class RAPPORClient(MemoizedClient):
    """Device side of RAPPOR: a cohort for life; ``report(v)`` returns ``(cohort, bits (num_bits,) uint8)``."""

    protocol: RAPPOR

    def __init__(self, protocol: RAPPOR, *, cohort: int | None = None, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        if cohort is None:
            cohort = int(self.rng.integers(0, protocol.num_cohorts))
        self.cohort = check_int(cohort, "cohort", 0, protocol.num_cohorts - 1)

    def _slot(self, value: Any) -> Any:
        if isinstance(value, np.generic):
            value = value.item()
        if self.protocol.domain_size is not None:
            return check_category(value, self.protocol.domain_size)
        encode_value(value)  # validates the type
        return value

    def _bloom(self, slot: Any) -> np.ndarray:
        bloom = np.zeros(self.protocol.num_bits, dtype=bool)
        bloom[bloom_indices(encode_value(slot), self.cohort, self.protocol.num_bits, self.protocol.num_hashes)] = True
        return bloom

    def _draw_prr(self, slot: Any, gen: np.random.Generator) -> str:
        prr = self.protocol.prr_bits(self._bloom(slot), gen.random(self.protocol.num_bits))
        return np.packbits(prr.astype(np.uint8)).tobytes().hex()

    def _irr(self, prr: str) -> tuple[int, np.ndarray]:
        bits = np.unpackbits(np.frombuffer(bytes.fromhex(prr), dtype=np.uint8))[: self.protocol.num_bits]
        return (self.cohort, self.protocol.irr_bits(bits.astype(bool), self.rng))

    def _device_state(self) -> dict[str, Any]:
        return {"cohort": self.cohort}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"cohort"}:
            raise ValueError("RAPPOR device state must contain exactly 'cohort'")
        self.cohort = check_int(state["cohort"], "cohort", 0, self.protocol.num_cohorts - 1)


RAPPOR.device_parameter = "cohort"
RAPPOR.client_class = RAPPORClient
