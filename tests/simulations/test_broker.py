"""The one throwaway-broker launcher (:func:`simulations.broker.start_broker`): options, restart, refusals."""

from __future__ import annotations

import subprocess

import pytest

from protocols.errors import BrokerUnavailable
from coordinator.mqtt_receiver import MAX_BATCHES_IN_FLIGHT, IngestSettings
from simulations import broker as broker_mod
from simulations.broker import MosquittoOptions, mosquitto_path, start_broker

pytestmark = pytest.mark.integration


def _queued_message_survives_restart(b) -> bytes:
    """A QoS 1 message queued for an offline persistent session is delivered after the broker restarts."""
    sub = ["mosquitto_sub", "-p", str(b.port), "-i", "keeper", "-c", "-q", "1", "-t", "t/x", "-C", "1", "-W", "10"]
    subprocess.run(sub[:-4] + ["-E"], check=True, timeout=15)  # register the persistent session, then leave
    subprocess.run(["mosquitto_pub", "-p", str(b.port), "-t", "t/x", "-m", "kept", "-q", "1"], check=True, timeout=15)
    b.restart()
    return subprocess.run(sub, capture_output=True, check=True, timeout=15).stdout.strip()


def test_persistent_mosquitto_keeps_queued_messages_across_restart(tmp_path):
    if mosquitto_path() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    options = MosquittoOptions(persistence=True, max_queued=7, max_inflight=0, extra_conf="# extra line\n")
    with start_broker(tmp_path, "mosquitto", options=options) as b:
        conf = (tmp_path / "mosquitto.conf").read_text()
        assert "persistence true" in conf and "max_queued_messages 7" in conf and "max_inflight_messages 0" in conf
        assert "autosave_interval 1\n" in conf  # a test's restart finds what was just queued
        assert conf.endswith("# extra line\n")
        assert _queued_message_survives_restart(b) == b"kept"
    assert b.proc.poll() is not None


def test_mosquitto_options_are_not_silently_dropped_for_amqtt(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_mod, "mosquitto_path", lambda: None)
    with pytest.raises(BrokerUnavailable):
        start_broker(tmp_path, "auto", options=MosquittoOptions(persistence=True))


def test_given_configuration_replaces_the_generated_one(tmp_path):
    """``MosquittoOptions(conf=...)``: the broker runs on that configuration, plus the persistence lines and
    ``extra_conf``; none of the generated listener or anonymous-access lines are written."""
    if mosquitto_path() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    port = broker_mod.free_port()
    given = f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 3\n"
    options = MosquittoOptions(persistence=True, conf=given, extra_conf="# extra line\n")
    with start_broker(tmp_path, "mosquitto", port=port, options=options) as b:
        conf = (tmp_path / "mosquitto.conf").read_text()
        assert given in conf and "persistence true" in conf and conf.endswith("# extra line\n")
        assert conf.count("listener ") == 1 and "max_queued_messages 100000" not in conf
        assert _queued_message_survives_restart(b) == b"kept"


def test_shipped_option_reads_the_shipped_broker_configuration(tmp_path):
    """The fleet-scale bench saves its broker's state as often as the shipped configuration does; an option the
    shipped file does not set is a KeyError, and the value reaches the generated configuration."""
    assert int(broker_mod.shipped_option("autosave_interval")) >= 1
    # an MQTT 3.1.1 coordinator gets the window an MQTT 5 one asks for (its batches in flight, and one filling)
    assert int(broker_mod.shipped_option("max_inflight_messages")) == IngestSettings().receive_maximum
    assert IngestSettings().receive_maximum >= (MAX_BATCHES_IN_FLIGHT + 1) * IngestSettings().batch_size
    with pytest.raises(KeyError):
        broker_mod.shipped_option("no_such_option")
    if mosquitto_path() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    with start_broker(tmp_path, "mosquitto", options=MosquittoOptions(persistence=True, autosave_interval=30)):
        assert "autosave_interval 30\n" in (tmp_path / "mosquitto.conf").read_text()
