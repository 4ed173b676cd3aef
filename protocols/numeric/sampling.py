"""k-sampling: mean estimation for vectors in [-1, 1]^d with a 1-D mechanism on k sampled coordinates (SPEC §3.4).

Reference: Wang et al., *Collecting and Analyzing Multidimensional Data with Local Differential Privacy*,
ICDE 2019, Algorithm 4 (k = max(1, min(d, ⌊ε/2.5⌋))).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from protocols.base import check_epsilon, check_unit_interval

from protocols import catalogue

from ._common import VectorMeanMechanism, as_result, check_dimension, check_rng
from ._grid import GridMechanism

__all__ = ["KSampling", "make_scalar_mechanism"]


def make_scalar_mechanism(name: str, epsilon: float) -> GridMechanism:
    """Build a 1-D pure-ε mechanism by name (a catalogue name with :attr:`~protocols.catalogue.Role.SCALAR`)."""
    known = catalogue.names(catalogue.Role.SCALAR)
    if name not in known:
        raise ValueError(f"unknown 1-D mechanism {name!r}; known: {', '.join(known)}")
    return cast(GridMechanism, catalogue.entry(name).cls(epsilon))  # every scalar role releases grid indices


class KSampling(VectorMeanMechanism):
    """Each user samples k of the d coordinates uniformly without replacement and reports, for j in the sample,
    ``(d/k)·M(t_j; ε/k)`` (M's debiased output), and 0 for the other coordinates.

    * ``k = max(1, min(d, ⌊ε/2.5⌋))``; ``M ∈ {hybrid, piecewise, duchi, pdp}`` (``base``), run at ε/k.
    * **Privacy:** the sample S is drawn independently of t, and given S the report has density
      ``Π_{j∈S} f_M(y_j | t_j; ε/k)`` (post-processing by the fixed scaling d/k and M's debiasing), so
      ``P[out | t1]/P[out | t2] = Σ_S P[S] Π_j f(·|t1_j) / Σ_S P[S] Π_j f(·|t2_j) ≤ (e^{ε/k})^k = e^ε``.
    * **Unbiased:** ``E[Y_j] = (k/d)·(d/k)·t_j = t_j``.
    * **Variance** of coordinate j: ``E[Y_j²] = (k/d)(d/k)² (Var_M(t_j; ε/k) + t_j²)``, so
      ``Var_j = (d/k)(Var_M(t_j; ε/k) + t_j²) - t_j²``.

    Released (SPEC §3.0): a row of d integers, ``0`` for a coordinate not sampled and ``1 + j`` for the base's
    grid index j (so at most ``base.grid + 1`` values per coordinate); ``debias`` gives ``(d/k)·M.debias(j)`` and 0,
    and ``estimate`` is the column mean of that.
    """

    def __init__(self, epsilon: float, d: int, base: str = "hybrid") -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0
        self.d = check_dimension(d)
        bases = catalogue.names(catalogue.Role.KSAMPLING_BASE)
        if base not in bases:
            raise ValueError(f"base must be one of {', '.join(bases)}, got {base!r}")
        self.base = base
        self.k = max(1, min(self.d, math.floor(self.epsilon / 2.5)))
        self.base_mechanism = make_scalar_mechanism(base, self.epsilon / self.k)
        self.scale = self.d / self.k
        self.grid = int(self.base_mechanism.grid) + 1

    @property
    def bound(self) -> float:
        """The largest |debiased value|: ``(d/k)·`` the base's (built on first use, like the base's table)."""
        return self.scale * float(self.base_mechanism.bound)

    def sample_coordinates(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``(n, k)`` indices: k distinct coordinates per user, uniformly (argpartition of i.i.d. uniforms)."""
        if self.k == self.d:
            return np.broadcast_to(np.arange(self.d), (n, self.d))
        if self.k == 1:
            return rng.integers(0, self.d, size=(n, 1))
        return np.argpartition(rng.random((n, self.d)), self.k - 1, axis=1)[:, : self.k]

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = self._check_values(values)
        rng = check_rng(rng)
        shape = t.shape
        t = t.reshape(-1, self.d)
        n = t.shape[0]
        cols = self.sample_coordinates(n, rng)
        rows = np.arange(n)[:, None]
        chosen = t[rows, cols]
        released = self.base_mechanism.privatize(chosen.ravel(), rng).reshape(chosen.shape)
        out = np.zeros(t.shape, dtype=np.int64)
        out[rows, cols] = released + 1
        return out.reshape(shape)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        """Released rows → ``(d/k)·M.debias(j)`` on sampled coordinates (value ``1 + j``), 0 elsewhere."""
        idx = self._check_report_rows(reports, self.grid)
        values = self.base_mechanism.debias(np.maximum(idx - 1, 0))
        return np.where(idx > 0, self.scale * values, 0.0)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        var = self.scale * (np.asarray(self.base_mechanism.variance(tt)) + tt**2) - tt**2
        return as_result(var, t)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "base": self.base}
