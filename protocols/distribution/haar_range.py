"""HaarHRR (Cormode, Kulkarni, Srivastava, PVLDB 12(10) 2019) behind the distribution interface.

A thin wrapper over :class:`protocols.haar.HaarHRR` with k = D buckets: the reports, the exact report
distribution, the unbiased histogram (whose total is exactly 1) and the analytic range variance
``L·Σ_h||ω_h||²/(2p-1)² - (f(1-ℓ/D)² + (1-f)(ℓ/D)²)`` are HaarHRR's own (see its docstring). A range estimate is
the sum of the histogram over the range, which equals HaarHRR's O(log D)-coefficient range estimator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int
from protocols.distribution.base import AnalyticDistribution, check_range
from protocols.distribution.grid import MAX_BUCKETS
from protocols.haar import HaarHRR

__all__ = ["HaarDistribution"]


class HaarDistribution(AnalyticDistribution):
    """HaarHRR over D buckets; reports (n, 3) int64 ``(level, Hadamard index, ±1)``."""

    method = "haar_hrr"

    def __init__(self, epsilon: float, D: int) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
        self.inner = HaarHRR(self.epsilon, self.D)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        return self.inner.privatize(values, rng)

    def report_distribution(self, value: int) -> np.ndarray:
        """Exact P[report | bucket] over all reports (:meth:`HaarHRR.report_distribution`)."""
        return self.inner.report_distribution(value)

    def estimate(self, reports: Any) -> np.ndarray:
        return np.asarray(self.inner.estimate(reports), dtype=float)

    def statistics_total(self, reports: Any) -> np.ndarray:
        """Per level h = 0..L-1, the signed sums Σ y over the reports at each Hadamard index j < 2^h, concatenated
        (D - 1 values; :meth:`HaarHRR.level_estimates` transforms these)."""
        r = self.inner._check_reports(reports)
        return np.concatenate([np.bincount(r[r[:, 0] == h, 1], weights=r[r[:, 0] == h, 2].astype(float),
                                           minlength=1 << h) for h in range(self.inner.levels)])

    @property
    def statistics_size(self) -> int:
        return self.inner.D - 1

    def estimate_statistics(self, total: Any, n: int) -> np.ndarray:
        from protocols.haar import _fwht, haar_inverse

        t = np.asarray(total, dtype=float)
        if t.shape != (self.inner.D - 1,) or n <= 0:
            raise ValueError(f"HaarHRR statistics are {self.inner.D - 1} sums over n > 0 reports")
        scale = self.inner.levels / (n * self.inner._gain)
        c = np.concatenate([(2.0**h / self.inner.D) * scale * _fwht(t[(1 << h) - 1 : (2 << h) - 1])
                            for h in range(self.inner.levels)])
        return np.asarray(haar_inverse(1.0 / self.inner.D, c, self.inner.D)[: self.D], dtype=float)

    def range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        a, b = check_range(a, b, self.D)
        return self.inner.range_variance(a, b, f)
