"""Frequency oracles: unbiased histogram estimation over a categorical domain ``[0, k)`` under ε-LDP (SPEC §3.8).

Every oracle subclasses :class:`protocols.base.FrequencyOracle`: a validated constructor ``(epsilon, k, ...)``,
``privatize(values, rng)`` vectorised over users, ``support_counts(reports)`` vectorised over users (no per-user
Python loop anywhere on the decode path), ``estimate(reports)`` giving unbiased *fractions*
``f̂_v = (C_v/n - q)/(p - q)``, and ``variance(f)`` giving the exact per-user variance
``(q(1-q) + f(p-q)(1-p-q))/(p-q)²`` (divide by n for the estimate over n users). Each oracle also exposes
``likelihood(reports, value)``, the exact probability of each report under a given input, used by the exact
privacy tests (worst-case likelihood ratio = e^ε).

==================  ====================================  =========================================
oracle              report (one row per user)             p, q (support probabilities)
==================  ====================================  =========================================
GRR                 int64 value in [0, k)                 e^ε/(e^ε+k-1), 1/(e^ε+k-1)
SUE                 uint8 row of k bits                   e^{ε/2}/(e^{ε/2}+1), 1/(e^{ε/2}+1)
OUE                 uint8 row of k bits                   1/2, 1/(e^ε+1)
BLH, OLH            int64 pair [seed, y], y in [0, g)     e^ε/(e^ε+g-1), 1/g
HadamardResponse    int64 y in [0, K), K set by ``rows``  e^ε/(e^ε+t-1), 1/t with t = 2^rows
PublicMatrixOracle  int64 pair [user index i, y = ±1]     e^ε/(e^ε+1), 1/2 (over the public matrix)
==================  ====================================  =========================================

HadamardResponse chooses ``rows`` (the number of Hadamard rows cutting a support set) by ε and k: the cheapest design
(smallest output space K) within 1.1× of the optimal variance 4e^ε/(e^ε−1)², else the least-variance one —
``rows = 0`` is direct response with GRR's p, q and K = k — see :mod:`protocols.frequency.hadamard`.

Consistency post-processing (:func:`project_simplex`, :func:`clip_normalise`) is separate from ``estimate`` and
trades the unbiasedness of the raw estimate for a valid distribution.
"""

from protocols.frequency.direct import GRR, grr_perturb
from protocols.frequency.hadamard import HadamardResponse, fwht
from protocols.frequency.local_hashing import BLH, OLH, LocalHashing
from protocols.frequency.postprocess import clip_normalise, project_simplex
from protocols.frequency.public_matrix import PublicMatrixOracle, philox4x32
from protocols.frequency.unary import OUE, SUE, UnaryEncoding

__all__ = [
    "GRR",
    "SUE",
    "OUE",
    "UnaryEncoding",
    "BLH",
    "OLH",
    "LocalHashing",
    "HadamardResponse",
    "PublicMatrixOracle",
    "project_simplex",
    "clip_normalise",
    "fwht",
    "grr_perturb",
    "philox4x32",
]
