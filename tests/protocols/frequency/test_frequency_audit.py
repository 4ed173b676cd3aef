"""Empirical LDP audits of the frequency oracles (LDP-Auditor style, :func:`protocols.audit.audit`).

Inputs v1 = 0, v2 = 1; for each oracle two events over the output space: the classic "the report supports v1"
event (likelihood ratio below e^ε) and a sharpened one that also requires the report *not* to support v2, whose
likelihood ratio is exactly e^ε — it gives the audit its power. ε_emp must never exceed ε; at ε = 1 it must exceed
ε/2 (the audit can see the mechanism's privacy loss). A deliberately mis-parameterised GRR is caught, and so is a
Hadamard response that runs at a larger ε than it states (rows = 1, 2 and the default, rows = 4 at k = 40).
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.audit import audit, equality_event
from protocols.frequency import BLH, GRR, OLH, OUE, SUE, HadamardResponse, PublicMatrixOracle
from protocols.hashing import hash_values
from tests.conftest import EPSILONS

pytestmark = pytest.mark.audit

K = 6
V1, V2 = 0, 1


def _events(oracle) -> list:
    if isinstance(oracle, GRR):
        return [equality_event(V1)]
    if isinstance(oracle, (SUE, OUE)):
        return [lambda r: r[:, V1] == 1, lambda r: (r[:, V1] == 1) & (r[:, V2] == 0)]
    if isinstance(oracle, (BLH, OLH)):

        def supports(r, v):
            return hash_values(r[:, 0], v, oracle.g) == r[:, 1]

        return [lambda r: supports(r, V1), lambda r: supports(r, V1) & ~supports(r, V2)]
    if isinstance(oracle, HadamardResponse):

        def in_c(r, v):
            return oracle.in_support(r, v)

        return [lambda r: in_c(r, V1), lambda r: in_c(r, V1) & ~in_c(r, V2)]
    if isinstance(oracle, PublicMatrixOracle):

        def agrees(r, v):
            return oracle.entries(v, r[:, 0]) == r[:, 1]

        return [lambda r: agrees(r, V1), lambda r: agrees(r, V1) & ~agrees(r, V2)]
    raise AssertionError(type(oracle))


FACTORIES = {
    "GRR": lambda eps: GRR(eps, K),
    "SUE": lambda eps: SUE(eps, K),
    "OUE": lambda eps: OUE(eps, K),
    "BLH": lambda eps: BLH(eps, K),
    "OLH": lambda eps: OLH(eps, K),
    "HR": lambda eps: HadamardResponse(eps, K),  # k = 6: direct response at these ε (variance-optimal)
    "HR-rows1": lambda eps: HadamardResponse(eps, K, rows=1),
    "HR-rows2": lambda eps: HadamardResponse(eps, K, rows=2),
    "PublicMatrix": lambda eps: PublicMatrixOracle(eps, K, key=b"audit"),
}


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_audit_never_exceeds_epsilon(name, epsilon, audit_trials):
    oracle = FACTORIES[name](epsilon)
    rng = np.random.default_rng(4242 + list(FACTORIES).index(name) * 10 + int(epsilon * 2))
    result = audit(oracle, V1, V2, _events(oracle), audit_trials, rng)
    assert result.passed, f"{name} at ε={epsilon}: ε_emp={result.epsilon_emp:.3f}"
    if epsilon == 1.0:  # power: the sharpened event's ratio is e^ε, so the audit sees most of ε
        assert result.epsilon_emp > 0.5 * epsilon, f"{name}: audit too weak, ε_emp={result.epsilon_emp:.3f}"


def test_grr_audit_power_with_the_equality_event(audit_trials):
    result = audit(GRR(1.0, K), V1, V2, equality_event(V1), audit_trials, np.random.default_rng(5))
    assert 0.5 < result.epsilon_emp <= 1.0


class _MislabelledGRR(GRR):
    """Runs GRR at 2.5 but claims ε = 1: the audit must catch it."""

    def __init__(self) -> None:
        super().__init__(2.5, K)
        self.epsilon = 1.0


def test_audit_catches_understated_epsilon(audit_trials):
    result = audit(_MislabelledGRR(), V1, V2, equality_event(V1), audit_trials, np.random.default_rng(6))
    assert not result.passed and result.epsilon_emp > 1.5


class _MislabelledHR(HadamardResponse):
    """Runs Hadamard response at 2.5 but claims ε = 1: the audit must catch it."""

    def __init__(self, rows: int | None) -> None:
        super().__init__(2.5, 40, rows=rows)
        self.epsilon = 1.0


@pytest.mark.parametrize("rows", [1, 2, 4, None])
def test_audit_catches_understated_epsilon_of_hadamard_response(rows, audit_trials):
    oracle = _MislabelledHR(rows)
    # k = 40 at ε = 2.5: direct response by default (1.03x the optimum, K = k); the least-variance t = 16 is rows = 4
    assert oracle.rows == (0 if rows is None else rows)
    result = audit(oracle, V1, V2, _events(oracle), audit_trials, np.random.default_rng(7 + (rows or 0)))
    assert not result.passed and result.epsilon_emp > 1.5, f"rows={oracle.rows}: ε_emp={result.epsilon_emp:.3f}"
