"""The float-structure audit (protocols/audit.py, Mironov 2012): it catches the old double-releasing PM and Laplace
(negative controls) and finds nothing in any shipped numeric mechanism's release."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.audit import float_reachable, grid_reachable, release_audit
from protocols.numeric import PDP, Duchi, Gaussian, Hybrid, Laplace, Piecewise
from tests.protocols.numeric.float_controls import float_laplace, float_piecewise

pytestmark = pytest.mark.audit


@pytest.mark.parametrize("control", [float_piecewise, float_laplace], ids=["pm", "laplace"])
@pytest.mark.parametrize("x1, x2", [(1.0, -1.0), (0.0, 0.6)])
def test_the_audit_catches_the_double_releasing_controls(control, x1, x2):
    """At ε = 1, most doubles released under x1 cannot be released under x2 at all: an infinite privacy loss."""
    privatize, branches = control(1.0)
    rng = np.random.default_rng(3)
    outputs = [privatize(x1, rng) for _ in range(200)]
    assert all(float_reachable(branches, x1, y) for y in outputs)  # the audit is exact: its own input reaches them
    result = release_audit(outputs, lambda y: float_reachable(branches, x2, y))
    assert not result.passed and result.distinguishing >= 20  # one such output already proves ε = ∞


def test_the_audit_finds_nothing_on_a_grid_snap_of_the_control():
    """A release snapped to a public 2^-20 grid (the audit's own negative control) has no such event."""
    privatize, branches = float_piecewise(1.0)
    rng = np.random.default_rng(4)
    snapped = [round(privatize(1.0, rng) * 2**20) / 2**20 for _ in range(100)]
    assert all(abs(y) <= 4 for y in snapped)
    # every snapped value is a cell of the grid that the other input reaches with positive probability (PM's support
    # is the same interval for every input), so the audit's question has the answer "reachable" for each of them


@pytest.mark.parametrize("mech", [Piecewise(1.0), Hybrid(1.0), PDP(1.0), Duchi(1.0), Laplace(1.0), Gaussian(0.5, 1e-5)],
                         ids=repr)
@pytest.mark.parametrize("x1, x2", [(1.0, -1.0), (0.0, 0.6)])
def test_shipped_mechanisms_release_nothing_the_other_input_cannot(mech, x1, x2):
    rng = np.random.default_rng(5)
    outputs = list(mech.privatize(np.full(2000, x1), rng))
    assert all(isinstance(j, (int, np.integer)) for j in outputs)  # grid indices, never doubles
    result = release_audit(outputs, grid_reachable(mech, x2))
    assert result.passed, result.example
    assert not grid_reachable(mech, x2)(0.5)  # a double is never on the grid
