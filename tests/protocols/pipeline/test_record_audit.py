"""Empirical ε audit (LDP-Auditor style) of the whole HaarRecord report: ε_emp ≤ ε = ε_m + ε_c, with power.

Two input pairs, each with events on the m̃ column and on the root-detail column c̃_0:

* m-pair: x = (1,1,1,1) vs (-1,-1,-1,-1): m = ±1, every detail 0 — distinguishes through M_m only;
* c-pair: x = (1,1,-1,-1) vs (-1,-1,1,1): m = 0, root detail c_0 = ±1 — distinguishes through M_c only.

(No record has both m = ±1 and a non-zero detail, which is why the record-level ε is below ε_m + ε_c: see the
exact tests in tests/protocols/pipeline/test_record.py.)
"""

import numpy as np
import pytest

from protocols.audit import audit
from protocols.pipeline import HaarRecord
from tests.conftest import EPSILONS

pytestmark = pytest.mark.audit

D_AUDIT = 4  # D = 4: k-sampling samples the root detail w.p. 1/3, which gives the c-audit power
M_PAIR = (np.ones(D_AUDIT), -np.ones(D_AUDIT))
C_PAIR = (np.array([1.0, 1.0, -1.0, -1.0]), np.array([-1.0, -1.0, 1.0, 1.0]))


def _column_event(column: int, threshold: float, mech=None):
    """``value > threshold`` on one column of the debiased coefficients (``mech.debias`` of the released indices)."""
    return lambda r: mech.debias(r)[:, column] > threshold


def _scalar_thresholds(mech) -> list[float]:
    """Thresholds where a 1-D mechanism's output at t = 1 is e^ε times likelier than at t = -1."""
    name = type(mech).__name__
    if name == "PDP":
        return [0.0, 1.0 - mech.width / 2]
    if name == "Hybrid":
        return [0.0, 1.0, mech.duchi.bound * (1 - 1e-12)] if mech.alpha > 0 else [0.0]
    if name in ("Piecewise",):
        return [0.0, 1.0]
    return [0.0]  # Duchi: the sign


def _events(mech: HaarRecord) -> list:
    events = [_column_event(0, s, mech) for s in _scalar_thresholds(mech.mean)]
    detail = mech.detail
    if mech.detail_mechanism == "ksampling":
        base = detail.base_mechanism
        events += [_column_event(1, detail.scale * s, mech) for s in _scalar_thresholds(base)]
    else:
        events.append(_column_event(1, 0.0, mech))
    return events


def _audit_both_pairs(mech: HaarRecord, trials: int, rng: np.random.Generator):
    events = _events(mech)
    return (
        audit(mech, *M_PAIR, events, trials, rng),
        audit(mech, *C_PAIR, events, trials, rng),
    )


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_default_record_mechanism_passes_the_audit(rng, audit_trials, epsilon):
    mech = HaarRecord(epsilon, D_AUDIT)
    res_m, res_c = _audit_both_pairs(mech, audit_trials, rng)
    assert res_m.passed, res_m
    assert res_c.passed, res_c
    assert res_m.claimed_epsilon == epsilon
    assert abs(mech.epsilon_mean + mech.epsilon_detail - epsilon) < 1e-12


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize(("mean", "detail"), [("pdp", "ksampling"), ("hybrid", "duchi_md"), ("duchi", "duchi_md")])
def test_even_split_passes_the_audit_with_power(rng, audit_trials, epsilon, mean, detail):
    """ε_m = ε_c = ε/2: each pair finds a good part of its own half, never more than ε in total.

    Measured (20,000 trials per side): ε_emp of the m-pair ≈ 0.86–0.97·ε/2; of the c-pair ≈ 0.6–0.94·ε/2 with
    k-sampling and ≈ 0.3–0.45·ε/2 with Duchi multi-dim."""
    mech = HaarRecord(epsilon, D_AUDIT, mean, detail, split=0.5)
    res_m, res_c = _audit_both_pairs(mech, audit_trials, rng)
    assert res_m.passed and res_c.passed, (res_m, res_c)
    half = epsilon / 2
    # the audit is not vacuous: each pair sees a good part of its half. Duchi multi-dim's root sign is weakly
    # informative when the other details are 0 (records cannot put every detail at ±1), hence the lower bar.
    assert res_m.epsilon_emp > 0.6 * half, res_m
    assert res_c.epsilon_emp > (0.4 if detail == "ksampling" else 0.2) * half, res_c


class _UnperturbedMean(HaarRecord):
    """Claims ε but sends the mean coefficient in the clear."""

    def privatize(self, records, rng):
        out = super().privatize(records, rng)
        x = np.atleast_2d(np.asarray(records, dtype=float))
        out[:, 0] = np.where(x.mean(axis=1) > 0, self.mean.grid - 1, 0)  # the mean's sign, in the clear
        return out


class _UnperturbedDetails(HaarRecord):
    """Claims ε but sends the details through k-sampling without the 1-D randomizer."""

    def privatize(self, records, rng):
        out = super().privatize(records, rng)
        from protocols.haar import haar_forward

        _, c = haar_forward(np.atleast_2d(np.asarray(records, dtype=float)))
        top = self.detail.base_mechanism.grid  # 1 + the base's largest index
        out[:, 1:] = np.where(out[:, 1:] != 0, np.where(c > 0, top, 1), 0)  # each sampled detail's sign, in the clear
        return out


def test_audit_catches_leaky_variants(rng):
    leaky_m = _UnperturbedMean(1.0, D_AUDIT, "pdp", split=0.5)
    res = audit(leaky_m, *M_PAIR, [_column_event(0, 0.5, leaky_m)], 5000, rng)
    assert not res.passed, res
    leaky_c = _UnperturbedDetails(1.0, D_AUDIT, "pdp", split=0.5)
    res = audit(leaky_c, *C_PAIR, [_column_event(1, 0.5, leaky_c)], 5000, rng)
    assert not res.passed, res
