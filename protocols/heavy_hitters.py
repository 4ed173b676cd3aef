"""Heavy-hitter identification over a large domain [0, 2^L) on top of any frequency oracle (SPEC §3.13, §5).

**Bitwise construction (source 001; Bassily & Smith, "Local, private, efficient protocols for succinct
histograms", STOC 2015).** A public hash h: [0, 2^L) → [T] spreads items over T buckets. For every bit position
ℓ < L the derived item of x is d_ℓ(x) = 2·h(x) + bit_ℓ(x) ∈ [0, 2T) and is reported through a frequency oracle O
over [0, 2T). The server estimates f̂_ℓ(t, b) for every bucket t and bit b and sets bit ℓ of bucket t's candidate to
argmax_b f̂_ℓ(t, b); a candidate is kept if it hashes back to its bucket and its estimated bucket frequency
f̂(t) = mean_ℓ (f̂_ℓ(t, 0) + f̂_ℓ(t, 1)) reaches the report threshold η/2.
The keyword-only options ``threshold=`` (a frequency replacing η/2) and ``top_k=`` (the k largest that
hash back and pass the threshold) select as for prefix extension below (:func:`select_prefixes`).

Budget (stated, never hidden): with ``split_users=True`` (default) every device is assigned to ONE bit position
(parallel composition over disjoint groups) and spends ε; with ``split_users=False`` it reports all L derived items
with ε each and spends L·ε (sequential composition). ``epsilon_per_user`` gives the figure to charge.

Guarantee (detection threshold η, :meth:`BitwiseHeavyHitters.detection_threshold`): with probability ≥ 1 - β,
every item x with f(x) ≥ η whose bucket holds other items of total frequency ≤ η/2 is reported, where
η = 2·z·σ_D, z = Φ^{-1}(1 - β/(2LT)) (union bound over all bit decisions), σ_D = 2·sqrt(V/n_g) bounds the standard
deviation of a difference f̂_ℓ(t, 1) - f̂_ℓ(t, 0) (V the oracle's worst per-user variance, n_g the users per group).

**Prefix extension in rounds (PEM; Wang, Li, Jha et al., "Locally differentially private heavy hitter
identification", IEEE TDSC 2019) — sequentially interactive (SPEC §5).** Users are split into R groups, one per
round. Round r has prefix length s_r (s_0 = ``start_bits``, then +``step_bits``, the last equal to L); its public
candidate list C_r is every extension by ``step_bits`` bits of the prefixes kept in round r-1 (all 2^{s_0} prefixes in
round 0). Group r reports the index of its length-s_r prefix in the candidate list, or a catch-all index for "not a
candidate", through O over [0, |C_r| + 1). Each device takes part in one round: ε per device. An item is reported
if all its prefixes were kept. Which prefixes are kept is :func:`select_prefixes`:

* **default** (``threshold=None``): the prefixes whose estimate reaches the *significance threshold*
  τ_r = z_r·σ0_r, where σ0_r = sqrt(V_r(0)/n_r) is the standard deviation of the estimate of a prefix nobody holds
  (V_r(0) the oracle's per-user variance at frequency 0, n_r the round's users) and z_r = Φ^{-1}(1 - β/(R·|C_r|)).
  **Meaning:** a prefix held by no one passes with probability ≤ β/(R·|C_r|) (normal approximation), so with
  probability ≥ 1 - β no round keeps a prefix nobody holds — every reported item is held by someone (a per-item
  false-positive bound, union-bounded over all candidates of all rounds). Items are not required to be the top ones:
  every significantly non-zero item is reported, largest first.
* ``threshold=τ`` (keyword-only, a frequency in [0, 1]): keep the prefixes whose *estimated* frequency is at least
  τ in every round, as pure-ldp's PEM ``find_heavy_hitters(threshold=τ)`` does. No false-positive guarantee unless
  τ ≥ τ_r (then the default's holds too).
* ``top_k=k`` (keyword-only): keep at most the k best prefixes at each extension step (like PEM's top-k), among
  those passing the threshold (τ_r by default, or the explicit ``threshold`` — ``threshold=0`` is PEM's top-k minus
  negative estimates): the threshold is a floor, so the default's guarantee still holds.

At most ``max_keep`` prefixes are kept per round (by estimate) in every case. **Detection:** with probability
≥ 1 - β every item with f(x) ≥ η = max_r (τ_r + z_r·σ_r) is reported (σ_r from the oracle's worst per-user
variance; a prefix is at least as frequent as the item), unless ``max_keep`` or ``top_k`` truncates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_epsilon, check_int
from protocols.hashing import MAX_ITEM, hash_values

__all__ = ["HeavyHitterResult", "BitwiseHeavyHitters", "PrefixExtensionHeavyHitters", "default_oracle",
           "check_selection", "select_prefixes", "extend_prefixes", "prefix_items"]

OracleFactory = Callable[[float, int], FrequencyOracle]


def default_oracle(epsilon: float, k: int) -> FrequencyOracle:
    """Hadamard response: optimal-order variance and an O(n + K log K) decode."""
    from protocols.frequency import HadamardResponse

    return HadamardResponse(epsilon, k)


def _worst_variance(oracle: FrequencyOracle) -> float:
    return float(max(np.max(oracle.variance(0.0)), np.max(oracle.variance(1.0))))


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must lie in (0, 1), got {beta}")
    return beta


def check_selection(threshold: Any, top_k: Any) -> tuple[float | None, int | None]:
    """Validate the keyword options ``threshold`` (None or a frequency in [0, 1]) and ``top_k`` (None or an int ≥ 1)."""
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
            raise ValueError(f"threshold must be a frequency in [0, 1] or None, got {threshold!r}")
        threshold = float(threshold)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a frequency in [0, 1], got {threshold}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1 or None, got {top_k!r}")
        top_k = int(top_k)
    return threshold, top_k


def select_prefixes(estimates: Any, floor: Any, top_k: int | None = None, cap: int | None = None) -> np.ndarray:
    """Indices of the estimates that reach ``floor`` (one value, or one per estimate), largest first, at most
    ``top_k`` and ``cap`` of them.

    The one selection rule of both heavy-hitter protocols and the coordinator's planner (module docstring): the
    threshold is a floor, ``top_k`` keeps the k best of what passes it, ``cap`` is a resource limit.
    """
    est = np.asarray(estimates, dtype=float).reshape(-1)
    keep = np.flatnonzero(est >= floor)
    keep = keep[np.argsort(-est[keep], kind="stable")]
    limit = min(x for x in (top_k, cap, keep.size) if x is not None)
    return keep[:limit]


def extend_prefixes(kept: Any, step_bits: int) -> np.ndarray:
    """The candidates of one extension step: each prefix of ``kept`` followed by each of the 2^step_bits bit
    patterns, in that order — candidate ``i·2^step_bits + b`` is ``(kept[i] << step_bits) | b``."""
    kept = np.asarray(kept, dtype=np.int64)
    return ((kept[:, None] << step_bits) | np.arange(1 << step_bits)[None, :]).ravel()


def prefix_items(values: Any, bits: int, kept: Any, kept_bits: int, step_bits: int) -> np.ndarray:
    """Each value's oracle item in one prefix-extension round: the one encoding of both the simulation
    (:meth:`PrefixExtensionHeavyHitters.encode`) and the round contract (:func:`protocols.contract.heavy_hitter_items`).

    The round extends the distinct ``kept_bits``-bit prefixes ``kept`` by ``step_bits`` bits; its candidates are
    :func:`extend_prefixes` ``(kept, step_bits)``. A value ``x`` in ``[0, 2^bits)`` whose top ``kept_bits`` bits equal
    ``kept[i]`` maps to item ``i·2^step_bits + b``, ``b`` its next ``step_bits`` bits — the index of its
    ``(kept_bits + step_bits)``-bit prefix among the candidates. Any other value maps to the catch-all item
    ``len(kept)·2^step_bits`` (the number of candidates), so the round's oracle has ``len(kept)·2^step_bits + 1``
    items. The first round is ``kept = [0]``, ``kept_bits = 0``: the item is the value's top ``step_bits`` bits.
    Values are not range-checked here (callers do)."""
    v = np.asarray(values, dtype=np.int64)
    kept = np.asarray(kept, dtype=np.int64).reshape(-1)
    catch_all = kept.size * (1 << step_bits)
    if kept.size == 0:
        return np.full(v.shape, catch_all, dtype=np.int64)
    prefix = v >> (bits - kept_bits)
    nxt = (v >> (bits - kept_bits - step_bits)) & ((1 << step_bits) - 1)
    order = np.argsort(kept, kind="stable")
    pos = np.minimum(np.searchsorted(kept[order], prefix), kept.size - 1)
    idx = order[pos]
    return np.where(kept[idx] == prefix, idx * (1 << step_bits) + nxt, catch_all).astype(np.int64)


def _check_items(values: Any, bits: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("values must be a non-empty 1-D array of items")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"items must be integers in [0, 2^{bits}), got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= (1 << bits):
        raise ValueError(f"items must lie in [0, 2^{bits})")
    return arr


@dataclass(frozen=True)
class HeavyHitterResult:
    """Reported items (sorted by decreasing estimated frequency), their estimates and the thresholds used."""

    items: np.ndarray
    frequencies: np.ndarray
    detection_threshold: float
    report_threshold: float
    epsilon_per_user: float

    def as_dict(self) -> dict[int, float]:
        return {int(i): float(f) for i, f in zip(self.items, self.frequencies)}


class BitwiseHeavyHitters:
    """Source 001's bitwise heavy-hitter protocol over items in [0, 2^bits) (module docstring)."""

    def __init__(
        self,
        epsilon: float,
        bits: int,
        buckets: int,
        hash_seed: int,
        *,
        split_users: bool = True,
        oracle_factory: OracleFactory = default_oracle,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.bits = check_int(bits, "bits", 1, MAX_ITEM.bit_length() - 1)
        self.buckets = check_int(buckets, "buckets", 1)
        if isinstance(hash_seed, bool) or not isinstance(hash_seed, (int, np.integer)) or not 0 <= hash_seed < 1 << 62:
            raise ValueError("hash_seed (public, from the round parameters) must be an integer in [0, 2^62)")
        self.hash_seed = int(hash_seed)
        self.split_users = bool(split_users)
        self.oracle = oracle_factory(self.epsilon, 2 * self.buckets)
        if not isinstance(self.oracle, FrequencyOracle) or self.oracle.k != 2 * self.buckets:
            raise ValueError("oracle_factory(epsilon, k) must return a FrequencyOracle over [0, k)")

    @property
    def epsilon_per_user(self) -> float:
        """ε if users are split over bit positions (parallel composition), bits·ε otherwise (sequential)."""
        return self.epsilon if self.split_users else self.bits * self.epsilon

    def bucket(self, items: Any) -> np.ndarray:
        """Public hash h(x) ∈ [0, T)."""
        return hash_values(np.int64(self.hash_seed), np.asarray(items, dtype=np.int64), self.buckets)

    def derived_items(self, items: np.ndarray, position: Any) -> np.ndarray:
        """d_ℓ(x) = 2·h(x) + bit_ℓ(x)."""
        return 2 * self.bucket(items) + ((items >> np.asarray(position, dtype=np.int64)) & 1)

    def assign_groups(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Bit position of each device when users are split (balanced, random)."""
        return rng.permutation(np.arange(n) % self.bits)

    def privatize(self, values: Any, rng: np.random.Generator) -> dict[int, Any]:
        """Reports per bit position: {ℓ: oracle reports of the devices reporting position ℓ}."""
        x = _check_items(values, self.bits)
        if self.split_users:
            groups = self.assign_groups(x.size, rng)
            return {ell: self.oracle.privatize(self.derived_items(x[groups == ell], ell), rng)
                    for ell in range(self.bits) if np.any(groups == ell)}
        return {ell: self.oracle.privatize(self.derived_items(x, ell), rng) for ell in range(self.bits)}

    def detection_threshold(self, n: int, beta: float = 1e-3) -> float:
        """η such that items with f ≥ η (and light buckets) are reported w.p. ≥ 1 - β (module docstring)."""
        from scipy import stats  # here, not at the top: the device imports this module (prefix_items), never scipy

        n = check_int(n, "n", 1)
        group = n / self.bits if self.split_users else n
        z = stats.norm.isf(_check_beta(beta) / (2 * self.bits * self.buckets))
        return 2 * z * 2 * math.sqrt(_worst_variance(self.oracle) / group)

    def identify(self, reports: dict[int, Any], n: int, beta: float = 1e-3, *, threshold: float | None = None,
                 top_k: int | None = None) -> HeavyHitterResult:
        """Decode candidates bucket by bucket; report those that hash back and reach η/2 (or ``threshold``, a
        frequency), at most the ``top_k`` largest (module docstring of :func:`select_prefixes`)."""
        threshold, top_k = check_selection(threshold, top_k)
        if set(reports) != set(range(self.bits)):
            raise ValueError(f"reports are needed for every bit position 0..{self.bits - 1}")
        est = np.stack([self.oracle.estimate(reports[ell]) for ell in range(self.bits)])  # (L, 2T)
        pairs = est.reshape(self.bits, self.buckets, 2)
        bit_values = (pairs[:, :, 1] > pairs[:, :, 0]).astype(np.int64)  # (L, T)
        candidates = (bit_values << np.arange(self.bits)[:, None]).sum(axis=0)
        bucket_freq = pairs.sum(axis=2).mean(axis=0)
        eta = self.detection_threshold(n, beta)
        floor = eta / 2 if threshold is None else threshold
        hashes_back = self.bucket(candidates) == np.arange(self.buckets)
        keep = np.flatnonzero(hashes_back)[select_prefixes(bucket_freq[hashes_back], floor, top_k)]
        return HeavyHitterResult(candidates[keep], bucket_freq[keep], eta, floor, self.epsilon_per_user)

    def run(self, values: Any, rng: np.random.Generator, beta: float = 1e-3, *, threshold: float | None = None,
            top_k: int | None = None) -> HeavyHitterResult:
        """Privatize and identify in one call (simulation)."""
        check_selection(threshold, top_k)
        x = _check_items(values, self.bits)
        return self.identify(self.privatize(x, rng), x.size, beta, threshold=threshold, top_k=top_k)


class PrefixExtensionHeavyHitters:
    """Prefix-extension heavy hitters in rounds over items in [0, 2^bits) (module docstring); ε per device."""

    def __init__(
        self,
        epsilon: float,
        bits: int,
        start_bits: int,
        step_bits: int,
        *,
        max_keep: int = 64,
        oracle_factory: OracleFactory = default_oracle,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.bits = check_int(bits, "bits", 1, MAX_ITEM.bit_length() - 1)
        self.start_bits = check_int(start_bits, "start_bits", 1, self.bits)
        self.step_bits = check_int(step_bits, "step_bits", 1, self.bits)
        self.max_keep = check_int(max_keep, "max_keep", 1)
        self.oracle_factory = oracle_factory
        lengths = [self.start_bits]
        while lengths[-1] < self.bits:
            lengths.append(min(self.bits, lengths[-1] + self.step_bits))
        self.prefix_lengths = lengths
        if (1 << self.start_bits) > 1 << 20 or (self.max_keep << self.step_bits) > 1 << 20:
            raise ValueError("candidate lists above 2^20 entries: lower start_bits, step_bits or max_keep")

    @property
    def rounds(self) -> int:
        return len(self.prefix_lengths)

    @property
    def epsilon_per_user(self) -> float:
        """Each device reports in exactly one round."""
        return self.epsilon

    def candidates(self, round_index: int, kept: np.ndarray | None) -> np.ndarray:
        """Public candidate prefixes of round r: all 2^{s_0} prefixes, or the extensions of last round's kept ones."""
        r = check_int(round_index, "round_index", 0, self.rounds - 1)
        if r == 0:
            return np.arange(1 << self.start_bits, dtype=np.int64)
        if kept is None:
            raise ValueError("rounds after the first need the previous round's kept prefixes")
        return extend_prefixes(kept, self.prefix_lengths[r] - self.prefix_lengths[r - 1])

    def encode(self, values: np.ndarray, round_index: int, candidates: np.ndarray) -> np.ndarray:
        """Index of each device's length-s_r prefix in ``candidates`` (this round's :meth:`candidates`), or
        len(candidates) for "not a candidate": :func:`prefix_items` of the kept prefixes they extend."""
        kept_bits = self.prefix_lengths[round_index - 1] if round_index > 0 else 0
        grow = self.prefix_lengths[round_index] - kept_bits
        candidates = np.asarray(candidates, dtype=np.int64)
        kept = candidates[:: 1 << grow] >> grow
        if not np.array_equal(extend_prefixes(kept, grow), candidates):
            raise ValueError(f"candidates must be round {round_index}'s candidate list (candidates())")
        return prefix_items(values, self.bits, kept, kept_bits, grow)

    def significance_threshold(self, n_round: int, oracle: FrequencyOracle, candidates: int,
                               beta: float = 1e-3) -> tuple[float, float]:
        """(τ_r, η_r) of one round (module docstring): τ_r = z_r·sqrt(V(0)/n_r), the estimate a prefix nobody holds
        reaches with probability ≤ β/(R·|C_r|); η_r = τ_r + z_r·sqrt(V_worst/n_r), the frequency above which a
        prefix is kept with probability ≥ 1 - β/(R·|C_r|)."""
        from scipy import stats  # here, not at the top: the device imports this module (prefix_items), never scipy

        n_round = max(1, int(n_round))
        z = stats.norm.isf(_check_beta(beta) / (self.rounds * max(1, int(candidates))))
        null = float(np.max(oracle.variance(0.0)))
        tau = z * math.sqrt(null / n_round)
        return tau, tau + z * math.sqrt(_worst_variance(oracle) / n_round)

    def run(self, values: Any, rng: np.random.Generator, beta: float = 1e-3, *, threshold: float | None = None,
            top_k: int | None = None) -> HeavyHitterResult:
        """Simulate all rounds (users split into balanced random groups, one per round).

        ``threshold`` (a frequency) replaces the significance threshold τ_r; ``top_k`` keeps at most the k best
        prefixes per round among those passing it (module docstring). ``report_threshold`` is the last round's
        threshold, ``detection_threshold`` η = max_r η_r.
        """
        threshold, top_k = check_selection(threshold, top_k)
        if top_k is not None and top_k > self.max_keep:
            raise ValueError(f"top_k must not exceed max_keep ({self.max_keep}), got {top_k}")
        x = _check_items(values, self.bits)
        beta = _check_beta(beta)
        groups = rng.permutation(np.arange(x.size) % self.rounds)
        kept: np.ndarray | None = None
        eta_max, floor = 0.0, 0.0
        est_kept = np.zeros(0)
        for r in range(self.rounds):
            cands = self.candidates(r, kept)
            if cands.size == 0:
                break
            oracle = self.oracle_factory(self.epsilon, int(cands.size) + 1)
            members = x[groups == r]
            reports = oracle.privatize(self.encode(members, r, cands), rng)
            est = oracle.estimate(reports)[: cands.size]
            tau, eta = self.significance_threshold(members.size, oracle, cands.size, beta)
            floor = tau if threshold is None else threshold
            eta_max = max(eta_max, eta - tau + floor)
            keep = select_prefixes(est, floor, top_k, self.max_keep)
            kept, est_kept = cands[keep], est[keep]
        items = np.zeros(0, dtype=np.int64) if kept is None else kept
        return HeavyHitterResult(items, est_kept, eta_max, floor, self.epsilon_per_user)
