"""The ``auto`` choice (protocols/pipeline/auto.py): the lowest-variance mechanism for a query, the variances it
compared, and AutoRecord delegating to the chosen mechanism."""

import numpy as np
import pytest

from protocols import catalogue
from protocols.pipeline import AutoRecord, HaarRecord, choose_mechanism
from protocols.pipeline.auto import query_variance


def test_choose_mechanism_reports_what_it_compared():
    ch = choose_mechanism(1.0, 8, "mean")
    haar_labels = [k for k in ch.variances if k.startswith("haar[")]
    assert sorted(k.split("+")[1] for k in haar_labels) == ["duchi_md]", "ksampling]"]
    assert len(ch.variances) == 4 and {"ksampling", "duchi_md"} <= set(ch.variances)
    assert ch.variances[ch.label] == min(ch.variances.values())
    # SPEC §2.4: per-coordinate, Haar sums L+1 noisy terms — direct HM k-sampling wins
    assert ch.name == "ksampling"
    rebuilt = catalogue.build(ch.name, **ch.params)
    assert query_variance(rebuilt, "mean") == pytest.approx(ch.variances["ksampling"])
    haar = min((k for k in ch.variances if k.startswith("haar")), key=ch.variances.get)
    assert ch.variances[haar] > 3 * ch.variances["ksampling"]


def test_haar_wins_the_total_at_moderate_epsilon():
    ch = choose_mechanism(2.0, 8, "total")
    assert ch.name == "haar"
    mech = HaarRecord(**ch.params)
    assert mech.split == ch.mechanism.split and mech.mean_mechanism == ch.mechanism.mean_mechanism
    assert ch.variances[ch.label] < 0.6 * ch.variances["ksampling"]


def test_frequency_choice():
    small = choose_mechanism(2.0, 1, "frequency", k=3)
    assert small.name == "grr" and set(small.variances) == {"grr", "oue", "olh"}
    large = choose_mechanism(1.0, 1, "frequency", k=64)
    assert large.name in ("oue", "olh")
    split = choose_mechanism(2.0, 4, "frequency", k=16)
    assert split.params["epsilon"] == pytest.approx(0.5) and split.mechanism.epsilon == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs the domain size"):
        choose_mechanism(1.0, 2, "frequency")


def test_frequency_oracle_mean_candidate_is_exact_for_grr():
    """Worst-case variance of the histogram-derived mean, checked against a direct computation for GRR."""
    ch = choose_mechanism(1.0, 1, "mean", k=3)
    from protocols.frequency import GRR

    grr = GRR(1.0, 3)
    a = np.array([-1.0, 0.0, 1.0])
    worst = 0.0
    for x in range(3):
        p = np.where(np.arange(3) == x, grr.p, grr.q)
        est = (a - grr.q * a.sum()) / (grr.p - grr.q)  # per-user estimate of the mean given report y
        worst = max(worst, float(p @ est**2 - (p @ est) ** 2))
    assert ch.variances["grr"] == pytest.approx(worst)
    assert ch.name != "grr"  # numeric mechanisms beat a 3-ary oracle for a mean


@pytest.mark.parametrize(("kwargs", "match"), [({"query": "median"}, "query"), ({"k": 1}, "k must be")])
def test_choose_mechanism_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        choose_mechanism(1.0, 3, **kwargs)


def test_auto_record_delegates(rng):
    auto = AutoRecord(1.0, 4)
    assert auto.choice.name == "ksampling" and auto.epsilon == 1.0
    x = rng.uniform(-1, 1, (500, 4))
    reports = auto.privatize(x, rng)
    assert auto.estimate(reports).shape == (4,)
    np.testing.assert_allclose(auto.variance(x), auto.mechanism.variance(x))
    assert auto.worst_case_variance() == pytest.approx(auto.mechanism.worst_case_variance(), rel=1e-9)
    total = AutoRecord(4.0, 4, query="total")
    assert isinstance(total.mechanism, HaarRecord) and total.estimate(total.privatize(x, rng)).shape == (4,)
    with pytest.raises(ValueError, match="AutoRecord query"):
        AutoRecord(1.0, 4, query="frequency")
