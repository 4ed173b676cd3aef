"""The MQTT receiver process's module: light to start (paho only), and its settings checked before it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator import mqtt_receiver
from protocols import wire

ROOT = Path(__file__).resolve().parents[2]


def test_receiver_imports_nothing_but_paho_and_the_shared_mqtt_setup():
    code = ("import sys, coordinator.mqtt_receiver; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pydantic', 'cryptography', "
            "'sqlite3', 'scipy'}), sorted(m for m in sys.modules if m.startswith('protocols')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[] ['protocols', 'protocols.mqtt']"


def test_topics_agree_with_the_wire_format():
    assert mqtt_receiver.REPORTS_WILDCARD == wire.REPORTS_WILDCARD
    assert mqtt_receiver.subscription_topic("g") == f"$share/g/{wire.REPORTS_WILDCARD}"


@pytest.mark.parametrize("change, message", [
    ({"batch_size": 0}, "batch_size"), ({"batch_ms": 0}, "batch_ms"), ({"protocol": "4"}, "protocol"),
    ({"tls_key": "k.pem"}, "tls_key without tls_cert"), ({"shared_group": "a/b"}, "shared-subscription group"),
])
def test_bad_settings_are_refused_before_anything_starts(change, message):
    with pytest.raises(ValueError, match=message):
        mqtt_receiver.IngestSettings(**change).check()


def test_the_receipt_backlog_is_bounded_and_drains_as_the_broker_acknowledges(monkeypatch):
    """Receipts the broker has not acknowledged are capped (paho's 16-bit message ids must stay free for round
    publications): past the cap a receipt is dropped and counted; acknowledgements make room again."""
    import multiprocessing
    import types

    a, b = multiprocessing.Pipe()
    rec = mqtt_receiver.Receiver(mqtt_receiver.IngestSettings(), a)
    monkeypatch.setattr(mqtt_receiver, "MAX_RECEIPTS_IN_FLIGHT", 5)
    mids = iter(range(1, 1000))
    published = []

    def publish(topic, payload, qos=0, retain=False):
        published.append(topic)
        return types.SimpleNamespace(rc=0, mid=next(mids))

    monkeypatch.setattr(rec.client, "publish", publish)
    rec._receipts([(f"t{i}", b"r") for i in range(12)])
    assert len(published) == 5 and rec.receipts_dropped == 7
    for mid in (1, 2, 3):  # the broker acknowledges three
        rec._on_publish(rec.client, None, mid, None, None)
    rec._receipts([(f"u{i}", b"r") for i in range(4)])
    assert len(published) == 8 and rec.receipts_dropped == 8
    assert rec.client._max_inflight_messages == mqtt_receiver.MAX_OUTGOING_IN_FLIGHT
    a.close()
    b.close()
