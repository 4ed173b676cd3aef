"""The round contract's helpers (protocols/contract.py): normalisation to [-1, 1] and back."""

import numpy as np
import pytest

from protocols.contract import denormalise, normalise


def test_normalise_and_denormalise():
    lo, hi = np.array([0.0, -5.0]), np.array([100.0, 5.0])
    x = np.array([[50.0, 0.0], [150.0, -7.0], [0.0, 5.0]])
    t = normalise(x, lo, hi)
    np.testing.assert_allclose(t, [[0.0, 0.0], [1.0, -1.0], [-1.0, 1.0]])  # clipped first
    np.testing.assert_allclose(denormalise(t, lo, hi), np.clip(x, lo, hi))
    with pytest.raises(ValueError, match="hi > lo"):
        normalise(x, hi, lo)
    with pytest.raises(ValueError, match="finite"):
        normalise([np.nan], 0, 1)
