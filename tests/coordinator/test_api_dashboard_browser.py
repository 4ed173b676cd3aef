"""The coordinator's dashboard in headless Chromium: the page served on loopback renders the charts, populated
with the estimates of stored rounds (numeric bands over rounds, frequency bars with interval whiskers).

Skipped when Chromium is not installed (Debian: ``apt-get install -y chromium``)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from protocols.contract import make_body, normalise
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
N = 300
PARAMS = {"streams": {
    "temp": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 2.0}, "dims": ["temp"],
             "bounds": [[0, 50]]},
    "env": {"kind": "haar", "mechanism": "haar", "dims": ["hum", "co2"], "bounds": [[0, 100], [300, 2000]],
            "params": {"epsilon": 3.0, "d": 2, "mean_mechanism": "hybrid", "detail_mechanism": "ksampling",
                       "split": 0.5}},
    "mode": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 2.0, "k": 4}, "dims": ["mode"],
             "labels": ["idle", "busy", "boost", "off"]},
}}


def _chromium(*args: str, tmp_path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def _fill(coord: Coordinator, rng: np.random.Generator) -> None:
    fleet = SimFleet(N, prefix="web")
    coord.import_devices(fleet.enrollment())
    for r, rid in enumerate(("r1", "r2", "r3")):
        coord.open_round(rid, 8.0, PARAMS)
        spec = coord.rounds.params(rid).streams
        temp = rng.normal(20 + 3 * r, 4, N).clip(0, 50)
        env = np.column_stack([rng.uniform(30, 70, N), rng.uniform(400, 900, N)])
        mode = rng.choice(4, N, p=[0.5, 0.3, 0.15, 0.05])
        rows = {
            "temp": spec["temp"].build().privatize(normalise(temp, 0, 50), rng),
            "env": spec["env"].build().privatize(normalise(env, *spec["env"].lo_hi()), rng),
            "mode": spec["mode"].build().privatize(mode, rng),
        }
        accepted = []
        for stream, out in rows.items():
            mech, codec = spec[stream].build(), spec[stream].entry
            for dev, row in zip(fleet.devices, out):
                body = make_body(codec.encode_row(mech, row))
                accepted.append(coord.validator.check(*dev.report(rid, stream, spec[stream].wire_mechanism, body)))
        coord.store.commit_batch(accepted, {})
        coord.close_round(rid)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_dashboard_renders_populated_charts_in_headless_chromium(tmp_path):
    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt=False, http_port=0))
    coord.start()
    try:
        _fill(coord, np.random.default_rng(5))
        url = coord.dashboard_url
        dom = _chromium("--dump-dom", url, tmp_path=tmp_path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert "<h1>haarvest coordinator</h1>" in html and "accepted" in html
        svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
        assert len(svgs) == 4  # temp, env.hum, env.co2 over rounds + the latest mode frequencies
        # numeric charts: a band and a line over the 3 rounds, with real coordinates
        bands = re.findall(r'<polygon class="band" points="([^"]+)"', html)
        assert len(bands) == 3 and all(len(b.split()) == 6 for b in bands)
        assert len(re.findall(r'<circle class="est"', html)) == 9
        coords = [float(v) for b in bands for p in b.split() for v in p.split(",")]
        assert all(np.isfinite(coords)) and len(set(coords)) > 10
        # an interval whisker at each of the 9 round points and on each of the 4 bars; a legend on every chart
        assert len(re.findall(r'<rect class="bar"', html)) == 4 and len(re.findall(r'<line class="ci"', html)) == 13
        assert len(re.findall(r'<g class="legend"', html)) == 4 and "95% interval" in html
        assert "share of devices" in html
        assert all(label in html for label in ("idle", "busy", "boost", "off"))
        heights = [float(h) for h in re.findall(r'<rect class="bar"[^>]*height="([0-9.]+)"', html)]
        assert max(heights) > 20  # "idle" (≈ 50%) is a visible bar
        shot = tmp_path / "dashboard.png"
        res = _chromium(f"--screenshot={shot}", "--window-size=1280,1100", "--hide-scrollbars", url, tmp_path=tmp_path)
        assert res.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, res.stderr[-2000:]
    finally:
        coord.close()
