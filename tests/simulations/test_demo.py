"""The demo's latency stream without the network (``haarvest demo`` runs it end to end in tests/system/test_demo.py):
its data model, the devices' own stream spec and mechanism, and the coordinator's estimate — the p50/p95 intervals
the demo prints cover the fleet's true quantiles at about the nominal rate, over many data seeds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from coordinator.estimate import estimate_stream
from edge_agent.plans import stream_specs
from protocols import wire
from protocols.contract import StreamSpec
from simulations.demo import (LATENCY_BOUNDS, QUANTILES, DemoData, _device_config, _quantile_rows,
                              load_adult_rows)

pytestmark = pytest.mark.statistical


@dataclass(frozen=True)
class _Broker:
    host: str = "127.0.0.1"
    port: int = 1883
    protocol: str = "5"


def _adult():
    try:
        return load_adult_rows()
    except (FileNotFoundError, OSError, ValueError):
        pytest.skip("Adult data (data/adult) not available")


def test_latency_quantile_intervals_cover_the_fleets_true_quantiles(tmp_path):
    adult = _adult()
    cfg = _device_config(0, tmp_path, _Broker(), wire.public_key_b64(wire.generate_signing_key()))
    spec = StreamSpec.model_validate(stream_specs(cfg)["latency"])
    assert spec.kind == "distribution" and spec.bounds == [LATENCY_BOUNDS] and spec.epsilon == 4.0
    mech, grid = spec.build(), spec.grid()
    noise = np.random.default_rng(20261126)
    inside = {q: [] for q in QUANTILES}
    p95 = []
    for seed in range(300):
        data = DemoData(200, 4, np.random.default_rng(seed), adult)
        p95.append([data.true_quantiles(r)[1] for r in range(4)])
        for r in range(4):
            rows = mech.privatize_unit(grid.unit(data.latency[r]), noise)  # what each device sends
            est = estimate_stream(spec, rows, f"r{r + 1}", "latency", level=0.95, consistency=False)
            got = _quantile_rows(f"r{r + 1}", "latency", est, data.true_quantiles(r), 0.95)
            assert [g["item"] for g in got] == ["p50", "p95"] and all(g["unit"] == "ms" for g in got)
            for q, g in zip(QUANTILES, got):
                inside[q].append(g["inside"])
    coverage = {q: float(np.mean(v)) for q, v in inside.items()}
    # nominal 95%; the quantile interval inverts a pointwise CDF band and interpolates inside a bucket, so a few
    # points of slack (1,200 intervals each: a standard error of 0.6 points)
    assert all(c >= 0.91 for c in coverage.values()), coverage
    # volatile: the congestion episode (22% of devices slowed in round 3) about doubles the fleet's p95 (round 1:
    # 4%), and the declared bound stays above it
    p95 = np.array(p95)
    assert np.median(p95[:, 2] / p95[:, 0]) > 1.8 and np.all(p95[:, 2] > 1.1 * p95[:, 0])
    assert np.all(p95 < LATENCY_BOUNDS[1])


def test_bound_notes_name_the_quantiles_whose_interval_ran_into_the_top_bucket():
    from simulations.demo import bound_notes

    def row(rid, item, high):
        return {"round": rid, "stream": "latency", "kind": "distribution", "item": item, "unit": "ms", "n": 200,
                "ci_high": high, "top_bucket": [968.75, 1000.0]}

    rows = [row("r1", "p50", 80.0), row("r1", "p95", 993.8), row("r2", "p50", 90.0), row("r2", "p95", 600.0),
            {"kind": "numeric", "ci_high": 5000.0}]
    assert bound_notes(rows) == ["latency p95: its interval ran into the top bucket (up to the declared 1000 ms) in "
                                 "1 of 2 rounds — 200 devices cannot bound it from above at this ε; its lower end "
                                 "still holds"]
    assert bound_notes(rows[:1]) == []
