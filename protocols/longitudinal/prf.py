"""A vectorised pseudo-random function for fleet simulations: stateless memoization for n users at once.

Simulating n devices that each memoize a PRR per slot would need a per-user table (or n HMAC calls per round).
Instead, the fleet simulator gives every simulated device a 64-bit key and derives the uniform numbers of its
PRR for slot s deterministically as ``U(key, s) = splitmix64(splitmix64(key ⊕ stream) + s·φ) / 2^64`` — the same
"memoization without a table" pattern as the devices' HMAC-seeded PRR, in numpy. SplitMix64 (Steele, Lea & Flood,
OOPSLA 2014) is a bijective 64-bit mixer with good statistical quality; it is *not* cryptographic and is used
only by simulations (devices use HMAC-SHA256, :mod:`protocols.longitudinal.memo`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["draw_keys", "prf_uniform", "splitmix64"]

_PHI = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def splitmix64(x: Any) -> np.ndarray:
    """The SplitMix64 finaliser applied elementwise (uint64 in, uint64 out, wrapping arithmetic)."""
    z = np.array(x, dtype=np.uint64, ndmin=1)
    z ^= z >> _S30
    np.multiply(z, _M1, out=z)
    z ^= z >> _S27
    np.multiply(z, _M2, out=z)
    z ^= z >> _S31
    return z


def draw_keys(n: int, rng: np.random.Generator) -> np.ndarray:
    """n independent 64-bit PRF keys for simulated devices."""
    return rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)


def prf_uniform(keys: Any, index: Any, stream: int) -> np.ndarray:
    """U(key, index) ∈ [0, 1) with 53-bit resolution, broadcasting ``keys`` against non-negative ``index``.

    Distinct (key, stream, index) triples give independent-looking uniforms; equal triples give equal ones.
    """
    keys = np.array(keys, dtype=np.uint64, ndmin=1)
    idx = np.asarray(index)
    if idx.size and np.issubdtype(idx.dtype, np.signedinteger) and idx.min() < 0:
        raise ValueError("PRF indices must be non-negative")
    idx = np.array(idx, dtype=np.uint64, ndmin=1)
    base = splitmix64(keys ^ np.uint64((int(stream) * 0xD1B54A32D192ED03) & 0xFFFFFFFFFFFFFFFF))
    z = np.multiply(idx, _PHI)
    z = z + base  # broadcast; wrapping uint64 addition
    z = splitmix64(z)
    return (z >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)
