"""The evaluation in quick mode (what CI runs): every experiment runs, the report and the plots are written, and the
numbers are sane (measured errors agree with the analytic variances within generous factors, Haar range queries
beat flat sums on long ranges, the ledger totals respect each protocol's bound)."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from simulations.datasets import adult_dir
from simulations.eval.common import EvalConfig, Stat, best_of, summarise
from simulations.eval.runner import EXPERIMENTS, experiment_modules, run_experiments

pytestmark = [
    pytest.mark.skipif(not (adult_dir() / "adult-coarse.dat").is_file(), reason="Adult dataset not present"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # the peers call random.randint with floats
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    config = EvalConfig(out_dir=out, quick=True, reps=2, show_progress=False)
    start = time.perf_counter()
    sections, report = run_experiments(config)
    return config, {s.name: s for s in sections}, report, time.perf_counter() - start


def test_quick_mode_runs_every_experiment(quick_run):
    config, sections, report, _seconds = quick_run  # timed in make bench, never asserted (a loaded host)
    assert len(sections) == len(EXPERIMENTS)
    text = report.read_text()
    for s in sections.values():
        assert s.title in text
        for fig in s.figures:
            png = config.img_dir / fig.filename
            assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000, fig.filename
            assert f"img/{fig.filename}" in text
    assert "Which audit covers each mechanism" in text and "**missing**" not in text


def test_numeric_errors_match_the_analytic_variances(quick_run):
    _, sections, _, _ = quick_run
    theory = sections["epsilon"].data["theory"]
    for label, by_eps in sections["epsilon"].data["attribute_mse"].items():
        for eps, stat in by_eps.items():
            # mean of 2 repetitions × 6 attributes of squared errors: within a factor 10 of its expectation
            assert theory[label][eps] / 10 < stat.mean < theory[label][eps] * 10, (label, eps)


def test_range_queries_haar_beats_flat_sums_on_long_ranges(quick_run):
    _, sections, _, _ = quick_run
    analytic = sections["range"].data["analytic"][1.0]
    assert analytic["HaarHRR"][256] < analytic["OUE (sum of items)"][256] / 3
    assert analytic["HaarHRR"][1] > analytic["OUE (sum of items)"][1]  # and loses on point queries


def test_privacy_spent_respects_each_protocols_bound(quick_run):
    _, sections, _, _ = quick_run
    for label, row in sections["privacy"].data["summary"].items():
        assert 0 < row["mean"] <= row["max"], label
        if not np.isnan(row["bound"]):
            assert row["max"] <= row["bound"] + 1e-9, label


def test_evolving_has_our_rows_and_the_peers_when_installed(quick_run):
    _, sections, _, _ = quick_run
    post = sections["evolving"].data["post"]
    peers_installed = importlib.util.find_spec("multi_freq_ldpy") is not None  # the optional `bench` extra
    assert any("multi-freq-ldpy" in label for label in post) == peers_installed
    assert {"L-GRR", "L-OSUE", "BiLOLOHA", "OLOLOHA", "RAPPOR"} <= set(sections["evolving"].data["raw"])


def test_only_selects_and_rejects_unknown_names():
    assert [m.NAME for m in experiment_modules(["range", "epsilon"])] == ["epsilon", "range"]
    with pytest.raises(ValueError, match="unknown experiment"):
        experiment_modules(["nope"])


def test_config_rng_is_reproducible_and_label_specific(tmp_path):
    c = EvalConfig(out_dir=tmp_path)
    assert c.rng("a", 1).random() == c.rng("a", 1).random()
    assert c.rng("a", 1).random() != c.rng("a", 2).random()
    with pytest.raises(ValueError):
        EvalConfig(out_dir=tmp_path, reps=1)


def test_best_of_names_statistical_ties():
    a, b, c = Stat(1.0, 0.1, 10), Stat(1.05, 0.1, 10), Stat(5.0, 0.1, 10)
    text = best_of({"a": a, "b": b, "c": c})
    assert text.startswith("a (1)") and "tied with b" in text and "c" not in text.split("tied with")[1]
    assert summarise([1.0, 3.0]).std == pytest.approx(np.sqrt(2))


def test_peers_are_optional(monkeypatch):
    """Without the `bench` extra (multi-freq-ldpy, pure-ldp) the eval runs haarvest's mechanisms alone."""
    import sys

    from simulations.eval import exp_timing
    from simulations.eval.longitudinal import peer_protocols

    for name in ("multi_freq_ldpy", "pure_ldp"):
        for key in [k for k in sys.modules if k.split(".")[0] == name] or [name]:
            monkeypatch.setitem(sys.modules, key, None)  # `import name...` now raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    assert peer_protocols(1.0, 8) == []
    subjects = exp_timing.subjects(np.random.default_rng(0), jit=False)
    assert subjects and not any(s.peer for s in subjects)


def test_device_level_comparison_spends_the_same_budget(quick_run):
    """Every protocol of experiment 7 costs exactly B per window under the device unit (or cannot be configured)."""
    from protocols.frequency import GRR, OUE
    from simulations.eval.exp_device import CHAINS, ddrm_at_device_budget, ddrm_crossover

    _, sections, _, _ = quick_run
    data = sections["device"].data
    for (name, label), (floor, at) in data["floors"].items():
        assert floor > 0 and at > 0, (name, label)
    assert {label for _, label in data["floors"]} == set(CHAINS)
    # LOLOHA with g = 2: as ε∞ → 0 at α = 1/2 the IRR's input ε tends to ln 3 from above (never to 0)
    assert all(floor == pytest.approx(np.log(3), abs=2e-3) for (_, label), (floor, _) in data["floors"].items()
               if label == "BiLOLOHA")
    for k in (14, 360):
        proto = ddrm_at_device_budget(4.0, 16, k, 1)
        assert proto.device_epsilon(16) == pytest.approx(4.0)
    # the crossover is where DDRM-k's variance first falls below the rotation's: later than 1 report per window
    t = ddrm_crossover(4.0, 14)
    assert t is not None and t > 16
    assert min(GRR(4.0, 14).variance(0.0), OUE(4.0, 14).variance(0.0)) > 0
    for name in data["mse"]:
        assert set(data["mse"][name]) >= {"OUE every round (ε = B/T)", "DDRM-k, c = 1 declared changes"}


def test_distribution_section_measures_every_method_auto_and_coverage(quick_run):
    """Experiment 9 in quick mode: every method and auto measured on every query class, coverage fractions in
    [0, 1] for the methods with intervals (not Square Wave), wall times for every method, and conclusions that
    name the measured winners."""
    from simulations.eval import exp_distribution as X

    _, sections, _, _ = quick_run
    section = sections["distribution"]
    data = section.data
    assert len(data["populations"]) == 3
    for pop, by_eps in data["errors"].items():
        assert set(by_eps) == set(X.QUICK_EPSILONS)
        for eps, by_class in by_eps.items():
            assert {c for c, _, _ in X.query_classes(16 if pop.startswith("Adult") else X.TELEMETRY_D)} == set(by_class)
            for cls, row in by_class.items():
                assert set(row) == {*X.METHODS, X.AUTO}
                assert all(s.mean >= 0 and s.n == 2 for s in row.values()), (pop, eps, cls)
                assert data["auto_pick"][pop][eps][cls] != "Square Wave"
    assert set(data["coverage"]) == set(X.METHODS) - {"Square Wave"}
    for by_eps in data["coverage"].values():
        for row in by_eps.values():
            assert set(row) == set(X.COVERAGE_KINDS)
            assert all(0.0 <= s.mean <= 1.0 for s in row.values())
    assert set(data["timing"]) == set(X.METHODS)
    assert section.headline[0].startswith("Lowest error over ")

