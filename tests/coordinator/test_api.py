"""HTTP API + dashboard (coordinator/api.py, no broker: mqtt=False), its Prometheus metrics and the Grafana dashboard
built on them. The `haarvest coordinator` CLI: test_cli.py."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from protocols import catalogue

PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 1.0}, "dims": ["cpu"], "bounds": [[0, 100]]},
    "app": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": 1.0, "k": 4}, "dims": ["app"]},
}}


def _fill(coord: Coordinator, fleet: SimFleet, round_id: str, rng: np.random.Generator) -> None:
    duchi, grr = catalogue.build("duchi", epsilon=1.0), catalogue.build("grr", epsilon=1.0, k=4)
    rows = []
    for stream, mech, rep, built in [("cpu", "duchi", duchi.privatize(rng.uniform(-1, 1, len(fleet)), rng), duchi),
                                     ("app", "grr", grr.privatize(rng.integers(0, 4, len(fleet)), rng), grr)]:
        rows += [coord.validator.check(t, p) for t, p in fleet.reports(round_id, stream, mech, rep, built)]
    coord.store.commit_batch(rows, {})
    coord.validator.batch_committed()


def _get(url: str, token: str | None = None):  # noqa: ANN202
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read()


def test_api_and_dashboard(tmp_path):
    rng = np.random.default_rng(5)
    fleet = SimFleet(60)
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "a.db"), mqtt=False, http_port=0))
    with coord:
        coord.import_devices(fleet.enrollment())
        for rid in ("r1", "r2"):
            coord.open_round(rid, 2.0, PARAMS)
            _fill(coord, fleet, rid, rng)
        base, token = coord.http_url, coord.api.token
        health = json.loads(_get(base + "/healthz")[2])
        assert health["status"] == "ok"  # the probe needs no token
        # docs/coordinator.md quotes the body: the same keys, and the values of a coordinator without MQTT
        doc = (Path(__file__).resolve().parents[2] / "docs" / "coordinator.md").read_text()
        quoted = json.loads(re.search(r"`GET /healthz` \(JSON `(\{[^`]+\})`", doc).group(1))
        assert set(quoted) == set(health) and quoted["status"] == health["status"]
        rounds = json.loads(_get(base + "/api/rounds", token)[2])
        assert [r["round_id"] for r in rounds] == ["r1", "r2"] and rounds[0]["streams"] == ["app", "cpu"]
        assert json.loads(_get(base + "/api/rounds/r2", token)[2])["sig"]
        est = json.loads(_get(base + "/api/estimates/r1?level=0.9&variance=worst", token)[2])
        assert est["cpu"]["n"] == 60 and est["cpu"]["variance_basis"] == "worst" and est["cpu"]["level"] == 0.9
        assert len(est["app"]["estimate"]) == 4
        metrics = json.loads(_get(base + "/api/metrics", token)[2])
        assert metrics["stored_reports"] == 240 and metrics["store"]["accepted"] == 240
        devices = json.loads(_get(base + "/api/devices", token)[2])
        assert len(devices) == 60 and all(d["stored_reports"] == 4 for d in devices)
        status, ctype, page = _get(coord.dashboard_url)
        text = page.decode()
        assert status == 200 and ctype.startswith("text/html")
        assert text.count("<svg") == 2 and 'class="band"' in text and 'class="ci"' in text
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no external assets
        for bad in ("/api/estimates/nope", "/nothing", "/api/estimates/r1?level=2"):
            with pytest.raises(urllib.error.HTTPError) as err:
                _get(base + bad, token)
            assert err.value.code in (400, 404)


def test_api_without_credentials_is_refused_and_limits_hold(tmp_path):
    """Every route but /healthz needs a token from the token file (default <db>.api-token, mode 0600);
    at most max_threads requests at once (503 beyond), an idle client is dropped, the estimates cache is bounded."""
    import socket
    import time

    db = tmp_path / "a.db"
    coord = Coordinator(CoordinatorConfig(db=str(db), mqtt=False, http_port=0))
    with coord:
        token_file = db.with_suffix(".api-token")
        assert token_file.stat().st_mode & 0o777 == 0o600 and coord.api.token in token_file.read_text()
        base = coord.http_url
        assert _get(base + "/healthz")[0] == 200
        for path in ("/", "/api/rounds", "/api/metrics", "/api/devices", "/api/estimates/r1"):
            for token in (None, "x" * 32, coord.api.token[:-1]):
                with pytest.raises(urllib.error.HTTPError) as err:
                    _get(base + path, token)
                assert err.value.code == 401, path
        assert _get(base + "/api/rounds?token=" + coord.api.token)[0] == 200  # a browser's dashboard link
        assert _get(base + "/api/rounds", coord.api.token)[0] == 200
        # slow clients: each holds a thread until request_timeout; beyond max_threads the server answers 503 at once
        host, port = coord.api.httpd.server_address[:2]
        idle = [socket.create_connection((host, port)) for _ in range(8)]
        time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(base + "/healthz")
        assert err.value.code == 503
        for s in idle:
            s.close()
        time.sleep(0.3)
        assert _get(base + "/healthz")[0] == 200
        api = coord.api
        api.cache_size = 3
        for i in range(6):
            coord.open_round(f"q{i}", 2.0, PARAMS)
            api.estimates(f"q{i}")
        assert len(api._cache) == 3
    bad = tmp_path / "tokens"
    bad.write_text("short\n")
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "b.db"), mqtt=False, http_port=0, api_tokens_file=str(bad)))
    with pytest.raises(ValueError, match="at least 16"):
        coord.start()
    coord.close()


def test_prometheus_metrics_parse_with_the_librarys_own_parser(tmp_path):
    """/metrics is in the Prometheus text format (prometheus-client's parser reads it back): ingest
    counters, per-device rejections, round progress, the latest estimates with their interval bounds."""
    from prometheus_client.parser import text_string_to_metric_families

    rng = np.random.default_rng(7)
    fleet = SimFleet(40)
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "m.db"), mqtt=False, http_port=0))
    with coord:
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 2.0, PARAMS)
        _fill(coord, fleet, "r1", rng)
        coord.store.commit_batch([], {f"bad_body.{fleet.devices[0].device_id}": 3})
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(coord.http_url + "/metrics")
        assert err.value.code == 401
        status, ctype, body = _get(coord.http_url + "/metrics", coord.api.token)
        assert status == 200 and ctype.startswith("text/plain")
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        samples = {f: [(s.labels, s.value) for s in fams[f].samples] for f in fams}
        assert ({"round": "r1", "stream": "cpu"}, 40.0) in samples["haarvest_round_reports"]
        assert ({"device": fleet.devices[0].device_id, "reason": "bad_body"}, 3.0) in \
            [(lab, v) for lab, v in samples["haarvest_device_rejected"]]
        est = {lab["label"]: v for lab, v in samples["haarvest_estimate"] if lab["stream"] == "app"}
        lo = {lab["label"]: v for lab, v in samples["haarvest_estimate_ci_low"] if lab["stream"] == "app"}
        hi = {lab["label"]: v for lab, v in samples["haarvest_estimate_ci_high"] if lab["stream"] == "app"}
        assert len(est) == 4 and all(lo[k] <= est[k] <= hi[k] for k in est)
        assert ({"status": "active"}, 40.0) in samples["haarvest_devices"]


def test_grafana_dashboard_queries_only_exposed_metrics(tmp_path):
    """deploy/grafana/haarvest-dashboard.json: valid JSON whose every haarvest_* series is one /metrics exposes
    (read from a live endpoint with a filled round and a quarantined device)."""
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    root = Path(__file__).resolve().parents[2]
    dash = json.loads((root / "deploy" / "grafana" / "haarvest-dashboard.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"haarvest_[a-z_]+", t["expr"])}
    fleet = SimFleet(10)
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "g.db"), mqtt=False, http_port=0))
    with coord:
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 2.0, PARAMS)
        _fill(coord, fleet, "r1", np.random.default_rng(1))
        coord.store.commit_batch([], {f"bad_body.{fleet.devices[0].device_id}": 1})
        coord._quarantine([(fleet.devices[1].device_id, "test")])
        from collections import Counter

        coord.metrics.record_batch(1, 0, 0, Counter({"malformed": 1}), 0.0)  # what ingest records
        body = _get(coord.http_url + "/metrics", coord.api.token)[2].decode()
    exposed = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    assert used and used <= exposed, used - exposed

