"""Device and coordinator together over a real broker: ~20 agents, two rounds, the second planned from the first's
published aggregates, every report accepted, estimates within their confidence intervals; and the MQTT 3.1.1
path (amqtt) with both sides on ``protocol = "auto"``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from coordinator.rounds import plan_round
from protocols.contract import HeavyHitterSpec, heavy_hitter_items, parse_round_params
from coordinator.service import Coordinator, CoordinatorConfig
from edge_agent import Agent, run_fleet
from edge_agent.embed import categorical, enrolment, new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from edge_agent.state import State
from simulations.broker import amqtt_python
from tests.brokers import mosquitto, wait_until  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

N = 20
# z = 5 per interval: the ~30 intervals of the test all cover the truth except with probability ≈ 2e-5
LEVEL = 0.9999994
DIMS = [numeric("temp", 10, 40), numeric("hum", 0, 100), numeric("load", 0, 100), categorical("mode", 3),
        categorical("app", 4), categorical("site", 16)]
STREAMS = [
    {"name": "env", "dimensions": ["temp", "hum"], "mechanism": "haar", "epsilon": 3.0},
    {"name": "load", "dimensions": ["load"], "mechanism": "hybrid", "epsilon": 2.0},
    {"name": "mode", "dimensions": ["mode"], "epsilon": 2.0},
    {"name": "app", "dimensions": ["app"], "mechanism": "lgrr", "epsilon_1": 1.5, "epsilon_inf": 3.0},
    {"name": "site", "dimensions": ["site"], "mechanism": "oue", "epsilon": 3.0},
]
ROUND_EPS = 13.0


def _cfg(i, tmp_path, port, pub, protocol="5"):
    return simple_config(f"e2e-{i:03d}", tmp_path / "agents" / f"e2e-{i:03d}", DIMS, STREAMS, total_cap=100.0,
                         coordinator_public_key=pub, sample_interval_s=86400.0,
                         privacy={"max_round_epsilon": ROUND_EPS},
                         mqtt={"host": "127.0.0.1", "port": port, "protocol": protocol, "reconnect_min_s": 1,
                               "reconnect_max_s": 2})


_wait = wait_until


def _stored(coord, rid):
    return sum(c for (r, _), c in coord.store.report_counts().items() if r == rid)


def _truth(data, r, spec, stream):
    if stream == "env":
        return [data["temp"].mean(), data["hum"].mean()]
    if stream == "load":
        return [data["load"][r].mean()]
    if stream == "site":
        items = heavy_hitter_items(spec.heavy_hitters, data["site"])
        return np.bincount(items, minlength=spec.params["k"]) / N
    values = data[stream][r] if stream == "app" else data[stream]
    return np.bincount(values, minlength=spec.params["k"]) / N


def test_two_rounds_over_mosquitto_second_planned_from_the_first(tmp_path, mosquitto):  # noqa: F811
    rng = np.random.default_rng(7)
    data = {"temp": rng.uniform(15, 30, N), "hum": rng.uniform(20, 80, N),
            "load": np.clip(rng.uniform(10, 50, N) + np.array([[0.0], [15.0]]), 0, 100),
            "mode": rng.choice(3, N, p=[0.6, 0.3, 0.1]),
            "app": np.stack([a := rng.choice(4, N), np.where(rng.random(N) < 0.3, rng.choice(4, N), a)]),
            "site": np.where(rng.random(N) < 0.9, 9, rng.choice(16, N))}
    current = {"r": 0}

    def reading(i):
        return {"temp": float(data["temp"][i]), "hum": float(data["hum"][i]), "load": float(data["load"][current["r"], i]),
                "mode": int(data["mode"][i]), "app": int(data["app"][current["r"], i]), "site": int(data["site"][i])}

    coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt_port=mosquitto.port, http_port=None,
                                          client_id="e2e-coordinator", batch_ms=5.0)).start()
    agents = [Agent(_cfg(i, tmp_path, mosquitto.port, coord.public_key), CallableSource(lambda i=i: reading(i)),
                    secrets=new_identity()) for i in range(N)]
    coord.import_devices([enrolment(a.config, a.secrets) for a in agents])
    stop = threading.Event()
    fleet = threading.Thread(target=run_fleet, args=(agents,), kwargs={"stop": stop, "poll_s": 0.02}, daemon=True)
    fleet.start()
    try:
        assert _wait(lambda: all(a.transport.connected.is_set() for a in agents), 30)
        streams = agents[0].stream_specs()  # the devices' own specs: their bounds, their mechanisms
        hh = HeavyHitterSpec(bits=4, prefix_bits=0, step_bits=2, candidates=[0])
        streams["site"] = dict(streams["site"], heavy_hitters=hh.model_dump(), params={"epsilon": 3.0, "k": hh.k})
        params = parse_round_params({"streams": streams})
        history = []
        for r, rid in enumerate(("r1", "r2")):
            current["r"] = r
            if r == 0:
                rc = coord.open_round(rid, ROUND_EPS, params)
            else:
                rc = coord.rounds.open_next_round(rid, ROUND_EPS, params, history)
                # planned from round 1's published aggregates only, and recorded as such
                assert rc.depends_on == ["r1"]
                expected = plan_round(params, history).model_dump(mode="json", exclude_none=True)
                assert rc.params == expected
            params = parse_round_params(rc.params)
            assert _wait(lambda: _stored(coord, rid) == N * len(STREAMS), 30), _stored(coord, rid)
            coord.close_round(rid)
            est = coord.estimate(rid, level=LEVEL, consistency=False)
            history.append((rid, est))
            for stream, spec in params.streams.items():
                e = est[stream]
                assert e.error is None and e.n == N, (rid, stream, e.error)
                t = np.asarray(_truth(data, r, spec, stream))
                assert np.all(np.asarray(e.ci_low) <= t + 1e-9) and np.all(t <= np.asarray(e.ci_high) + 1e-9), \
                    (rid, stream, t, e.estimate, e.ci_low, e.ci_high)
        r2 = parse_round_params(coord.rounds.get("r2").params)
        assert r2.streams["load"].rounding is not None and r2.streams["env"].rounding is not None
        snap = coord.metrics_snapshot()
        assert snap["accepted"] == 2 * N * len(STREAMS) and snap["rejected_total"] == 0
        # closing the last open round cleared the retained rounds/current: "no open round", never a malformed config
        assert _wait(lambda: all(a.stats["rounds.cleared"] >= 1 for a in agents), 15)
        assert not any(k.startswith("rounds.malformed") for a in agents for k, v in a.stats.items() if v)
    finally:
        stop.set()
        fleet.join(30)
        coord.close()
    from protocols.longitudinal import LGRR

    irr = LGRR(3.0, 1.5, 4).irr_input_epsilon
    for a in agents:  # ledger = outbox (+ compacted) on every device; the device unit charges every report
        st = State(a.config.database_path)
        try:
            assert st.check_invariants()["ok"]
            app = [row["epsilon"] for row in st.ledger_rows(stream="app")]
            assert app == pytest.approx([irr, irr])  # the chain's IRR ε per report (device unit)
            assert st.pending_count() == 0
        finally:
            st.close()


@pytest.mark.skipif(amqtt_python() is None, reason="amqtt is not installed (make broker-venv)")
def test_mqtt_311_only_broker_with_auto_fallback_on_both_sides(tmp_path):
    from simulations.broker import start_broker

    broker = start_broker(tmp_path / "amqtt", kind="amqtt")
    coord = None
    agents = []
    try:
        coord = Coordinator(CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt_port=broker.port, mqtt_protocol="auto",
                                              client_id="e2e-amqtt-coordinator")).start()
        assert coord.ingest.protocol == 4  # MQTTv311
        agents = [Agent(_cfg(i, tmp_path, broker.port, coord.public_key, protocol="auto"),
                        CallableSource(lambda: {"temp": 20.0, "hum": 50.0, "load": 30.0, "mode": 1, "app": 2,
                                                "site": 9}), secrets=new_identity()) for i in range(3)]
        coord.import_devices([enrolment(a.config, a.secrets) for a in agents])
        stop = threading.Event()
        fleet = threading.Thread(target=run_fleet, args=(agents,), kwargs={"stop": stop, "poll_s": 0.02}, daemon=True)
        fleet.start()
        assert _wait(lambda: all(a.transport.connected.is_set() for a in agents), 30)
        assert all(a.transport.protocol == 4 for a in agents)  # fell back to MQTT 3.1.1
        coord.open_round("r1", ROUND_EPS, {"streams": {k: v for k, v in agents[0].stream_specs().items()
                                                       if k != "site"}})
        assert _wait(lambda: _stored(coord, "r1") == 3 * (len(STREAMS) - 1), 30)
        stop.set()
        fleet.join(30)
    finally:
        if coord is not None:
            coord.close()
        broker.stop()
