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
    """Receipts are handed to paho a few at a time (paho's own window is off, so nothing queues there and a round
    publication goes out at once) and each acknowledgement hands over the next; past the queue's cap a receipt is
    dropped and counted."""
    import multiprocessing
    import types

    a, b = multiprocessing.Pipe()
    rec = mqtt_receiver.Receiver(mqtt_receiver.IngestSettings(), a)
    monkeypatch.setattr(mqtt_receiver, "MAX_RECEIPTS_IN_FLIGHT", 5)
    monkeypatch.setattr(mqtt_receiver, "MAX_RECEIPTS_QUEUED", 10)
    mids = iter(range(1, 1000))
    published = []

    def publish(topic, payload, qos=0, retain=False):
        published.append(topic)
        return types.SimpleNamespace(rc=0, mid=next(mids))

    monkeypatch.setattr(rec.client, "publish", publish)
    rec._receipts([(f"t{i}", b"r") for i in range(12)])
    assert published == [f"t{i}" for i in range(5)] and rec.receipts_dropped == 2  # 5 out, 5 queued, 2 dropped
    for mid in (1, 2, 3):  # the broker acknowledges three: three more go out
        rec._on_publish(rec.client, None, mid, None, None)
    assert published == [f"t{i}" for i in range(8)]
    rec._receipts([(f"u{i}", b"r") for i in range(10)])
    assert len(published) == 8 and rec.receipts_dropped == 2 + 2  # 2 + 10 queued: 8 fit
    for mid in range(4, 30):  # every receipt acknowledged as it goes
        rec._on_publish(rec.client, None, mid, None, None)
    assert published == [f"t{i}" for i in range(10)] + [f"u{i}" for i in range(8)] and not rec._receipt_queue
    assert rec._receipts_out == 0
    assert rec.client._max_inflight_messages == 0  # paho queues nothing: a publication goes out at once
    a.close()
    b.close()


def test_closed_batches_wait_in_the_receiver_not_in_the_network_thread():
    """A drain keeps more batches coming than the coordinator commits: past MAX_BATCHES_IN_FLIGHT they queue in the
    receiver (the network thread returns at once, so it keeps reading the broker's acknowledgements) and go out in
    arrival order as earlier ones commit; only ``receive_maximum`` held messages make the network thread wait."""
    import multiprocessing
    import threading

    a, b = multiprocessing.Pipe()
    rec = mqtt_receiver.Receiver(mqtt_receiver.IngestSettings(batch_size=2, receive_maximum=100), a)
    rec.client.ack = lambda mid, qos: None
    for i in range(2 * (mqtt_receiver.MAX_BATCHES_IN_FLIGHT + 3)):  # every hand-over returns without waiting
        with rec._batch_lock:
            rec._pending.append((f"t{i}", b"p", i + 1, 1, rec._generation))
            if len(rec._pending) >= 2:
                rec._hand_over_locked()
    sent = [b.recv() for _ in range(mqtt_receiver.MAX_BATCHES_IN_FLIGHT)]
    assert [m[1] for m in sent] == list(range(mqtt_receiver.MAX_BATCHES_IN_FLIGHT)) and not b.poll(0.1)
    assert len(rec._ready) == 3
    rec._settle(0)  # one committed: the next goes out
    assert b.recv() == ("batch", mqtt_receiver.MAX_BATCHES_IN_FLIGHT, [("t6", b"p"), ("t7", b"p")])
    rec.settings.receive_maximum = 4  # a full window: the network thread waits until commits make room
    done = threading.Event()

    def hand_over():
        with rec._batch_lock:
            rec._pending.append(("x", b"p", 99, 1, rec._generation))
            rec._hand_over_locked()
        done.set()

    threading.Thread(target=hand_over, daemon=True).start()
    assert not done.wait(0.3)
    rec._settle(1)
    assert done.wait(5)
    a.close()
    b.close()
