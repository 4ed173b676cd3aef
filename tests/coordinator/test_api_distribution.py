"""Distribution streams in the HTTP API JSON, the dashboard (the CDF with its band) and the
Prometheus metrics (quantile gauges)."""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np

from coordinator.api import stream_charts
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from protocols.contract import StreamSpec, make_body

PARAMS = {"streams": {
    "lat": {"kind": "distribution", "mechanism": "distribution_flat", "params": {"epsilon": 2.0, "D": 16},
            "dims": ["lat"], "bounds": [[0.0, 100.0]], "units": ["ms"]},
    "sw": {"kind": "distribution", "mechanism": "distribution_square_wave", "params": {"epsilon": 2.0, "D": 16},
           "dims": ["lat"], "bounds": [[0.0, 100.0]]},
}}


def _get(url: str, token: str):  # noqa: ANN202
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def _fill(coord: Coordinator, fleet: SimFleet, rng: np.random.Generator) -> None:
    rows = []
    for name, raw in PARAMS["streams"].items():
        spec = StreamSpec.model_validate(raw)
        mech = spec.build()
        rep = mech.privatize_unit(spec.grid().unit(rng.normal(50, 12, len(fleet))), rng)
        rows += [coord.validator.check(d.topic, d.report("r1", name, spec.wire_mechanism,
                                                         make_body(spec.entry.encode_row(mech, r)))[1])
                 for d, r in zip(fleet.devices, rep)]
    coord.store.commit_batch(rows, {}, coord.validator.statistics)
    coord.validator.batch_committed()


def test_api_json_dashboard_and_metrics(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    rng = np.random.default_rng(11)
    fleet = SimFleet(300, signature="hmac-sha256")
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "d.db"), mqtt=False, http_port=0))
    with coord:
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 4.0, PARAMS)
        _fill(coord, fleet, rng)
        base, token = coord.http_url, coord.api.token
        est = json.loads(_get(base + "/api/estimates/r1", token))
        lat = est["lat"]
        assert lat["kind"] == "distribution" and lat["n"] == 300
        assert [q["q"] for q in lat["quantiles"]] == [0.5, 0.9, 0.95, 0.99]
        assert len(lat["cdf"]) == 16 and len(lat["cdf_low"]) == 16 and len(lat["edges"]) == 17
        page = _get(base + "/", token)
        assert "lat — CDF, r1" in page and "sw — CDF, r1" in page
        fams = {f.name: f for f in text_string_to_metric_families(_get(base + "/metrics", token))}
        samples = {f: [(s.labels, s.value) for s in fams[f].samples] for f in fams}
        val = {lab["q"]: v for lab, v in samples["haarvest_estimate_quantile"] if lab["stream"] == "lat"}
        lo = {lab["q"]: v for lab, v in samples["haarvest_estimate_quantile_low"] if lab["stream"] == "lat"}
        hi = {lab["q"]: v for lab, v in samples["haarvest_estimate_quantile_high"] if lab["stream"] == "lat"}
        assert set(val) == {"0.5", "0.9", "0.95", "0.99"} and all(lo[q] <= val[q] <= hi[q] for q in val)
        assert 35 < val["0.5"] < 65
        sw = {lab["q"] for lab, _ in samples["haarvest_estimate_quantile"] if lab["stream"] == "sw"}
        assert sw == set(val)  # Square Wave: quantiles without interval gauges
        assert not [1 for lab, _ in samples["haarvest_estimate_quantile_low"] if lab["stream"] == "sw"]
        assert [1 for lab, _ in samples["haarvest_estimate"] if lab["stream"] == "sw"]


def test_cdf_chart_overlays_the_truth():
    e = {"kind": "distribution", "n": 10, "mechanism": "distribution_haar", "error": None, "units": ["ms"],
         "edges": [0.0, 1.0, 2.0], "cdf": [0.4, 1.0], "cdf_low": [0.3, 1.0], "cdf_high": [0.5, 1.0],
         "quantiles": [{"q": 0.5, "value": 1.2, "low": 1.0, "high": 1.4}], "labels": ["a", "b"],
         "estimate": [0.4, 0.6], "ci_low": [], "ci_high": [], "level": 0.95}
    (chart,) = stream_charts([("r1", {"x": e})], {"r1": {"x": [0.45, 1.0]}})
    assert "x — CDF, r1" in chart and "p50 = 1.2" in chart and 'class="truth"' in chart


def test_cdf_chart_labels_at_most_eight_edges_ending_at_the_upper_bound():
    D = 32
    edges = [1000.0 * j / D for j in range(D + 1)]
    cdf = [min(1.0, (j + 1) / 8) for j in range(D)]
    e = {"kind": "distribution", "n": 10, "mechanism": "distribution_flat", "error": None, "units": ["ms"],
         "edges": edges, "cdf": cdf, "cdf_low": cdf, "cdf_high": cdf, "quantiles": [], "labels": [], "estimate": [],
         "ci_low": [], "ci_high": [], "level": 0.95}
    (chart,) = stream_charts([("r1", {"lat": e})])
    labels = [t for t in re.findall(r'<text x="[^"]*" y="[^"]*" font-size="10" text-anchor="middle"[^>]*>([^<]*)<',
                                    chart) if t]  # the x axis's labels (not the rotated y label)
    assert labels == ["125", "250", "375", "500", "625", "750", "875", "1000"]
