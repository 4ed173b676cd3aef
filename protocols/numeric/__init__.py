"""Numeric mean-estimation mechanisms for inputs normalised to [-1, 1] (SPEC §3.1–3.7).

Scalar (one value per user, :class:`~protocols.base.NumericMechanism`):
:class:`Laplace`, :class:`Gaussian` ((ε, δ)), :class:`Duchi`, :class:`Piecewise` (PM), :class:`Hybrid` (HM),
:class:`PDP` (repaired PPMC mean mechanism).
Vector (one row of d values per user, :class:`VectorMeanMechanism`): :class:`KSampling`, :class:`DuchiMultiDim`.

Every class validates its parameters (ValueError), privatizes vectorised over users, debiases to unbiased
per-user estimates, and gives the exact per-user ``variance(t)`` and ``worst_case_variance()``. Continuous
scalar mechanisms expose ``pdf(t, y)``, discrete ones ``pmf``/``output_probabilities``, so that the privacy
claim can be checked exactly (tests/protocols/numeric/test_numeric.py) and empirically (tests/protocols/numeric/test_numeric_audit.py).
"""

from ._common import MAX_EPSILON, VectorMeanMechanism
from .additive import SENSITIVITY, Gaussian, Laplace, analytic_gaussian_sigma, gaussian_exact_delta
from .duchi import Duchi, DuchiMultiDim, duchi_constant
from .pdp import PDP, optimal_pdp_width, pdp_variance
from .piecewise import HYBRID_EPSILON_STAR, Hybrid, Piecewise
from .sampling import KSampling, make_scalar_mechanism

__all__ = [
    "Laplace",
    "Gaussian",
    "Duchi",
    "Piecewise",
    "Hybrid",
    "PDP",
    "KSampling",
    "DuchiMultiDim",
    "VectorMeanMechanism",
    "MAX_EPSILON",
    "make_scalar_mechanism",
    "HYBRID_EPSILON_STAR",
    "SENSITIVITY",
    "duchi_constant",
    "optimal_pdp_width",
    "pdp_variance",
    "gaussian_exact_delta",
    "analytic_gaussian_sigma",
]
