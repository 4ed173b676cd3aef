"""`make bench`'s ingest section runs end to end in its quick mode (no timing is asserted: speed lives in the bench)."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not (shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto"))
                                 or not shutil.which("mosquitto_pub"), reason="needs mosquitto and its clients")]


def test_ingest_bench_quick_runs():
    from simulations.bench import ingest

    out = ingest.run(quick=True)
    for row in ("raw: mosquitto_pub", "raw: paho publisher", "1 coordinator, Ed25519, MQTT 5", "1 coordinator, HMAC, MQTT 3.1.1",
                "coordinator live"):
        assert row in out
    assert "of the raw mosquitto_pub rate" in out
