"""Fuzz the ingest validation: malformed, tampered, replayed, wrong-topic and wrong-round messages.

≥ 10^4 hostile messages in-process (none accepted, nothing but WireError raised, every one counted by reason),
then a smaller batch through a real mosquitto to a running coordinator.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from coordinator.rounds import RoundManager
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import wire
from protocols.errors import RejectReason

pytestmark = pytest.mark.fuzz

PARAMS = {"streams": {"cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0},
                              "dims": ["cpu"], "bounds": [[0, 100]]},
                      "app": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": 1.0, "k": 8},
                              "dims": ["app"]}}}
N_FUZZ = 10_000


def _flip(data: bytes, rng: np.random.Generator) -> bytes:
    arr = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        arr[int(rng.integers(len(arr)))] ^= 1 << int(rng.integers(8))
    return bytes(arr)


def _mutate_json(payload: bytes, rng: np.random.Generator) -> bytes:
    """Change one field of a signed report without re-signing it."""
    data = json.loads(payload)
    field = ["seq", "boot", "round_id", "stream", "body", "mechanism", "sig", "v", "extra", "device_id"][
        int(rng.integers(10))]
    if field in ("seq", "boot"):
        data[field] = int(data[field]) + int(rng.integers(1, 1000))
    elif field == "body":
        data["body"] = {"report": float(rng.normal())}
    elif field == "sig":
        data["sig"] = data["sig"][::-1]
    elif field == "v":
        data["v"] = 2
    elif field == "extra":
        data["extra"] = 1
    else:
        data[field] = data[field] + "x"
    return json.dumps(data).encode()


def hostile_messages(fleet: SimFleet, legit: list[tuple[str, bytes]], outsider: SimFleet,
                     rng: np.random.Generator, n: int) -> list[tuple[str, bytes, str]]:
    """(topic, payload, category) for n hostile messages; ``legit`` were accepted before (replays of them)."""
    out: list[tuple[str, bytes, str]] = []
    devs = fleet.devices
    malformed_fixed = [b"", b"{", b"[]", b"null", b"\xff\xfe", b"{}", b'{"v":1}', b"[" * 60_000, b"{\"a\":" * 20_000,
                       b"x" * (wire.MAX_PAYLOAD + 1), b'{"v":1,"device_id":"a","body":{"report":NaN}}']
    categories = ["malformed", "tampered", "replayed", "wrong_topic", "wrong_round", "forged", "bad_body"]
    for i in range(n):
        cat = categories[i % len(categories)]
        topic, payload = legit[int(rng.integers(len(legit)))]
        dev = devs[int(rng.integers(len(devs)))]
        if cat == "malformed":
            choice = int(rng.integers(4))
            if choice == 0:
                payload = malformed_fixed[int(rng.integers(len(malformed_fixed)))]
            elif choice == 1:
                payload = rng.bytes(int(rng.integers(0, 400)))
            elif choice == 2:
                payload = payload[: int(rng.integers(len(payload)))]
            else:
                payload = _flip(payload, rng)
        elif cat == "tampered":
            payload = _mutate_json(payload, rng)
        elif cat == "replayed":
            pass  # an exact copy of an accepted report
        elif cat == "wrong_topic":
            other = devs[int(rng.integers(len(devs)))]
            topic = [other.topic + "x", wire.status_topic(dev.device_id), "haarvest/v1/reports/",
                     "haarvest/v1/reports/a/b", wire.ROUNDS_CURRENT_TOPIC][int(rng.integers(5))]
        elif cat == "wrong_round":
            rid, stream, mech = [("nope", "cpu", "hybrid"), ("closed", "cpu", "hybrid"), ("r1", "mem", "hybrid"),
                                 ("r1", "cpu", "duchi"), ("r1", "app", "hybrid")][int(rng.integers(5))]
            topic, payload = dev.report(rid, stream, mech, {"report": 57})
        elif cat == "forged":
            if rng.random() < 0.5:  # an outsider's key, claiming an enrolled device id
                rep = wire.Report(device_id=dev.device_id, boot=1, seq=10**6 + i, round_id="r1", stream="cpu",
                                  mechanism="hybrid", body={"report": 17})
                topic = dev.topic
                payload = wire.sign_report(rep, topic, outsider.devices[0].key).to_bytes()
            else:  # a well-signed report from a device that was never enrolled
                topic, payload = outsider.devices[int(rng.integers(len(outsider)))].report(
                    "r1", "cpu", "hybrid", {"report": 17})
        else:  # bad_body / absurd counters, validly signed by an enrolled device
            body = [{"y": 1}, {"report": "x"}, {"report": [1, [2]]}, {"report": 10**30}, {"report": []},
                    {"report": True}, {"report": {"mean": 1}}][int(rng.integers(7))]
            if rng.random() < 0.2:  # a counter beyond int64: wire.Report refuses to build it, so bypass validation
                rep = wire.Report.model_construct(v=1, device_id=dev.device_id, boot=1, seq=2**64 + i,
                                                  round_id="r1", stream="cpu", mechanism="hybrid", body=body, sig="")
                topic = dev.topic
                payload = wire.sign_report(rep, topic, dev.key).to_bytes()
            else:
                topic, payload = dev.report("r1", "cpu", "hybrid", body)
        out.append((topic, payload, cat))
    return out


@pytest.fixture
def world(tmp_path):
    store = SQLiteStore(tmp_path / "f.db")
    fleet, outsider = SimFleet(40), SimFleet(5, prefix="outsider")
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    rounds = RoundManager(store, wire.generate_signing_key())
    rounds.open_round("closed", 2.0, PARAMS)
    rounds.close_round("closed")
    rounds.open_round("r1", 2.0, PARAMS)
    legit = [d.report("r1", "cpu", "hybrid", {"report": 57}) for d in fleet.devices]
    yield store, fleet, outsider, legit
    store.close()


def test_ten_thousand_hostile_messages_in_process(world):
    store, fleet, outsider, legit = world
    rng = np.random.default_rng(424242)
    validator = Validator(store)
    rows = [validator.check(t, p) for t, p in legit]
    store.commit_batch(rows, {})
    validator.batch_committed()
    messages = hostile_messages(fleet, legit, outsider, rng, N_FUZZ)
    reasons: Counter[str] = Counter()
    by_category: dict[str, Counter[str]] = {}
    for topic, payload, cat in messages:
        with pytest.raises(wire.WireError) as err:
            validator.check(topic, payload)
        reasons[err.value.reason] += 1
        by_category.setdefault(cat, Counter())[err.value.reason] += 1
    store.commit_batch([], dict(reasons))
    assert sum(reasons.values()) == N_FUZZ
    assert set(reasons) <= set(RejectReason), reasons
    assert by_category["replayed"] == Counter({"duplicate": by_category["replayed"].total()})
    assert set(by_category["wrong_topic"]) <= {"wrong_topic", "device_mismatch"}
    assert set(by_category["wrong_round"]) <= {"unknown_round", "round_closed", "wrong_stream", "wrong_mechanism",
                                               "already_reported"}
    assert set(by_category["forged"]) <= {"bad_signature", "unknown_device"}
    assert "bad_body" in by_category["bad_body"] and "schema" in by_category["bad_body"]
    assert len(list(store.iter_reports())) == len(legit)
    counters = store.counters()
    assert counters["accepted"] == len(legit)
    assert sum(v for k, v in counters.items() if k != "accepted") == N_FUZZ  # (no time assertion: make bench)


@pytest.mark.integration
def test_hostile_batch_through_the_broker(world, mosquitto, tmp_path):
    store, fleet, outsider, legit = world
    messages = hostile_messages(fleet, legit, outsider, np.random.default_rng(7), 700)
    messages = [(t, p, c) for t, p, c in messages
                if t.startswith("haarvest/v1/reports/") and t.count("/") == 3 and len(p) <= wire.MAX_PAYLOAD]  # what a broker delivers
    coord = Coordinator(CoordinatorConfig(mqtt_port=mosquitto.port, batch_ms=5), store=store).start()
    try:
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        pub.max_queued_messages_set(0)
        pub.connect("127.0.0.1", mosquitto.port)
        pub.loop_start()
        for topic, payload in legit:
            pub.publish(topic, payload, qos=1)
        for topic, payload, _ in messages:
            pub.publish(topic, payload, qos=1)
        total = len(legit) + len(messages)
        deadline = time.monotonic() + 30
        while coord.metrics.snapshot()["received"] < total and time.monotonic() < deadline:
            time.sleep(0.05)
        pub.disconnect()
        pub.loop_stop()
        snap = coord.metrics.snapshot()
        assert snap["received"] == total
        assert snap["accepted"] == len(legit)
        assert snap["rejected_total"] + snap["duplicates"] == len(messages)
        assert "internal_error" not in snap["rejected"]
        assert len(list(store.iter_reports())) == len(legit)
    finally:
        coord.stop()
