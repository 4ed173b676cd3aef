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
