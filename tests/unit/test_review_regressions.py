"""Regressions found in review: empty RAPPOR cohorts, and ε so large that double precision makes outputs deterministic."""

import numpy as np
import pytest

from protocols.longitudinal import RAPPOR
from protocols.longitudinal.rappor import RapporReports
from protocols.numeric import Duchi, DuchiMultiDim, Hybrid, MAX_EPSILON


def test_rappor_decodes_with_empty_high_cohorts():
    proto = RAPPOR(num_bits=16, num_hashes=2, num_cohorts=4)
    bits = np.random.default_rng(5).integers(0, 2, size=(10, 16)).astype(np.uint8)
    t_hat, n_c = proto.denoised_bit_counts(RapporReports(np.zeros(10, dtype=np.int64), bits))
    assert n_c.tolist() == [10, 0, 0, 0] and np.all(t_hat[1:] == 0) and np.all(np.isfinite(t_hat))


@pytest.mark.parametrize("cls", [Duchi, Hybrid])
def test_numeric_epsilon_cap_keeps_outputs_random(cls):
    assert MAX_EPSILON <= 30
    with pytest.raises(ValueError, match="epsilon"):
        cls(MAX_EPSILON + 1)
    with pytest.raises(ValueError, match="epsilon"):
        DuchiMultiDim(MAX_EPSILON + 1, 3)
