"""Empirical ε audits of the distribution mechanisms (LDP-Auditor style, :func:`protocols.audit.audit`).

Inputs: the two extreme buckets (Square Wave: u = 0 and u = 1). Events are chosen so that their likelihood ratio
is exactly e^ε, which gives the audit its power: Square Wave — the output lies in v1's window and not in v2's;
hierarchical intervals — at whatever level was sampled, the report supports v1's node and not v2's; flat — the
oracle's own sharpened event; HaarHRR — the events of ``tests/protocols/test_haar_audit.py``. ε_emp must never exceed ε and, at
ε ≤ 2, must see most of it. Negative controls: a Square Wave and a hierarchical mechanism that run at a larger ε
than they claim are caught.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.audit import audit
from protocols.distribution import FlatOracle, HaarDistribution, HierarchicalIntervals, SquareWave
from protocols.hashing import hash_values
from tests.protocols.test_haar_audit import _events as haar_events
from tests.conftest import EPSILONS

pytestmark = pytest.mark.audit

D = 4


def _square_wave_events(mech: SquareWave, v1: float, v2: float) -> list:
    def window(r, v):  # the released cells of the window that starts at v's grid position (v is a grid point)
        start = round(v * (mech.channel.positions - 1))
        r = np.asarray(r)
        return (r >= start) & (r < start + mech.channel.window)

    return [lambda r: window(r, v1), lambda r: window(r, v1) & ~window(r, v2)]


def _hierarchical_events(mech: HierarchicalIntervals, v1: int, v2: int) -> list:
    def supports(r, v):
        r = np.asarray(r)
        out = np.zeros(r.shape[0], dtype=bool)
        for lvl in range(1, mech.h + 1):
            at = r[:, 0] == lvl
            node = v // mech.B ** (mech.h - lvl)
            if mech.oracle_name == "oue":
                out[at] = r[at, 1 + node] == 1
            else:
                out[at] = hash_values(r[at, 1], node, mech.oracles[lvl].g) == r[at, 2]
        return out

    return [lambda r: supports(r, v1), lambda r: supports(r, v1) & ~supports(r, v2)]


def _flat_events(mech: FlatOracle, v1: int, v2: int) -> list:
    if mech.oracle_name == "oue":
        return [lambda r: r[:, v1] == 1, lambda r: (r[:, v1] == 1) & (r[:, v2] == 0)]

    def supports(r, v):
        return hash_values(r[:, 0], v, mech.oracle.g) == r[:, 1]

    return [lambda r: supports(r, v1), lambda r: supports(r, v1) & ~supports(r, v2)]


FACTORIES = {
    "square_wave": lambda eps: SquareWave(eps, D),
    "hier_oue": lambda eps: HierarchicalIntervals(eps, D, branching=2, oracle="oue"),
    "hier_olh": lambda eps: HierarchicalIntervals(eps, D, branching=2, oracle="olh"),
    "flat_oue": lambda eps: FlatOracle(eps, D, "oue"),
    "flat_olh": lambda eps: FlatOracle(eps, D, "olh"),
    "haar": lambda eps: HaarDistribution(eps, D),
}


def _inputs_and_events(mech):
    if isinstance(mech, SquareWave):
        return 0.0, 1.0, _square_wave_events(mech, 0.0, 1.0)
    if isinstance(mech, HierarchicalIntervals):
        return 0, D - 1, _hierarchical_events(mech, 0, D - 1)
    if isinstance(mech, FlatOracle):
        return 0, D - 1, _flat_events(mech, 0, D - 1)
    return 0, D - 1, haar_events(mech.inner, 0)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_audit_never_exceeds_epsilon(name, epsilon, audit_trials):
    mech = FACTORIES[name](epsilon)
    v1, v2, events = _inputs_and_events(mech)
    rng = np.random.default_rng(9191 + 10 * list(FACTORIES).index(name) + int(2 * epsilon))
    result = audit(mech, v1, v2, events, audit_trials, rng)
    assert result.passed, f"{name} at ε={epsilon}: ε_emp={result.epsilon_emp:.3f}"
    if epsilon <= 2.0:  # power: the sharpened events have likelihood ratio exactly e^ε
        assert result.epsilon_emp > 0.5 * epsilon, f"{name}: audit too weak, ε_emp={result.epsilon_emp:.3f}"


class _LeakySquareWave(SquareWave):
    """Runs Square Wave at ε = 3 but claims ε = 1: the audit must catch it."""

    def __init__(self) -> None:
        super().__init__(3.0, D)
        self._claimed_b = SquareWave(1.0, D).b
        self.epsilon = 1.0


class _LeakyHierarchical(HierarchicalIntervals):
    """Runs its level oracles at ε = 3 but claims ε = 1."""

    def __init__(self) -> None:
        super().__init__(3.0, D, branching=2, oracle="oue")
        self.epsilon = 1.0


@pytest.mark.parametrize("leaky", [_LeakySquareWave, _LeakyHierarchical])
def test_audit_catches_a_mechanism_claiming_a_smaller_epsilon(leaky):
    mech = leaky()
    v1, v2, events = _inputs_and_events(mech)
    result = audit(mech, v1, v2, events, 20_000, np.random.default_rng(77))
    assert not result.passed, f"ε_emp={result.epsilon_emp:.3f} did not exceed the claimed ε=1"
