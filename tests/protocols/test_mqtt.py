"""protocols.mqtt, the one home of MQTT client setup: protocol settings, the MQTT 5 → 3.1.1
fall-back rule, the client factory; the device, the round publisher and the coordinator's receiver use it."""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from coordinator import cli, mqtt_receiver
from coordinator.run_config import RunOptions
from edge_agent.config import MqttConfig
from edge_agent.transport import MqttTransport
from protocols import mqtt as setup
from protocols.errors import PublishError


def test_protocol_settings_and_the_order_they_are_tried_in():
    assert setup.PROTOCOLS == {"5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
    assert setup.attempts("5") == (mqtt.MQTTv5,)
    assert setup.attempts("3.1.1") == (mqtt.MQTTv311,)
    assert setup.attempts("auto") == (mqtt.MQTTv5, mqtt.MQTTv311)
    assert [setup.first_protocol(p) for p in ("5", "3.1.1", "auto")] == [mqtt.MQTTv5, mqtt.MQTTv311, mqtt.MQTTv5]
    assert [setup.protocol_name(p) for p in (mqtt.MQTTv5, mqtt.MQTTv311)] == ["5", "3.1.1"]
    with pytest.raises(ValueError, match="MQTT protocol"):
        setup.attempts("4")


def test_which_connack_means_the_broker_does_not_speak_mqtt5():
    unsupported = ReasonCode(PacketTypes.CONNACK, aName="Unsupported protocol version")
    assert unsupported.value == 0x84 and setup.refuses_mqtt5(unsupported)
    assert setup.refuses_mqtt5(1) and setup.refuses_mqtt5(0x84)  # 3.1.1 return code 1, MQTT 5 reason 0x84
    for other in (ReasonCode(PacketTypes.CONNACK, aName="Not authorized"), ReasonCode(PacketTypes.CONNACK), 0, 5):
        assert not setup.refuses_mqtt5(other)


def test_the_fall_back_rule():
    assert setup.may_fall_back("auto", mqtt.MQTTv5)
    assert not setup.may_fall_back("auto", mqtt.MQTTv311)  # already fell back: for good
    assert not setup.may_fall_back("5", mqtt.MQTTv5) and not setup.may_fall_back("3.1.1", mqtt.MQTTv311)
    assert setup.FALLBACK_AFTER == 2
    assert not setup.should_fall_back(0) and not setup.should_fall_back(1)
    assert setup.should_fall_back(2) and setup.should_fall_back(0, silent=True)


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311])
def test_the_factory_makes_a_version2_client(protocol):
    client = setup.new_client("dev-1", protocol, persistent=True)
    assert client.callback_api_version == CallbackAPIVersion.VERSION2
    assert client.protocol == protocol and client._client_id == b"dev-1"
    assert client._ssl_context is None and client.username is None
    if protocol == mqtt.MQTTv311:
        assert client._clean_session is False  # MQTT 5 persistence is at connect: session_connect_args
        assert setup.new_client("pub", protocol, persistent=False)._clean_session is True
    tls = setup.new_client("dev-1", protocol, persistent=False, tls=True, username="u", password="p", manual_ack=True)
    assert tls._ssl_context.verify_mode == ssl.CERT_REQUIRED and tls._ssl_context.check_hostname
    assert tls.username == "u" and tls.password == "p" and tls._manual_ack


def test_session_connect_args():
    assert setup.session_connect_args(mqtt.MQTTv311, 60) == {}
    args = setup.session_connect_args(mqtt.MQTTv5, 60.0, receive_maximum=100)
    assert args["clean_start"] is False
    assert args["properties"].SessionExpiryInterval == 60 and args["properties"].ReceiveMaximum == 100
    assert not hasattr(setup.session_connect_args(mqtt.MQTTv5, 60)["properties"], "ReceiveMaximum")


@pytest.mark.parametrize("protocol", ["5", "3.1.1", "auto"])
def test_the_device_transport_uses_it(protocol):
    transport = MqttTransport(MqttConfig(protocol=protocol), "dev-7")
    assert transport.protocol == setup.first_protocol(protocol)
    client = transport._make_client()
    expected = setup.new_client("dev-7", transport.protocol, persistent=True)
    assert client.protocol == expected.protocol and client._client_id == b"dev-7"
    assert getattr(client, "_clean_session", None) == getattr(expected, "_clean_session", None)
    assert client._reconnect_on_failure and client.will_topic


@pytest.mark.parametrize("protocol, tried", [("5", [mqtt.MQTTv5]), ("3.1.1", [mqtt.MQTTv311]),
                                             ("auto", [mqtt.MQTTv5, mqtt.MQTTv311])])
def test_the_round_publisher_tries_the_settings_attempts_in_order(protocol, tried, monkeypatch):
    seen = []

    def refuse(_o, version):  # noqa: ANN001
        seen.append(version)
        raise PublishError("refused")

    monkeypatch.setattr(cli, "_mqtt_connect", refuse)
    with pytest.raises(PublishError):
        cli._publish_rounds(RunOptions(mqtt_protocol=protocol), [("t", b"x")])
    assert seen == tried


@pytest.mark.parametrize("protocol", ["5", "3.1.1", "auto"])
def test_the_receiver_builds_its_client_with_the_shared_setup(protocol):
    """coordinator.mqtt_receiver's client is protocols.mqtt's persistent, manually acknowledging client."""
    settings = mqtt_receiver.IngestSettings(protocol=protocol, tls=True, username="u", password="p")
    assert settings.first_protocol == setup.first_protocol(protocol)
    for version in setup.attempts(protocol):
        theirs = mqtt_receiver.new_client(settings, version)
        ours = setup.new_client(settings.client_id, version, persistent=True, username="u", password="p", tls=True,
                                manual_ack=True)
        for attr in ("protocol", "_client_id", "_manual_ack", "username", "password", "_tls_insecure"):
            assert getattr(theirs, attr) == getattr(ours, attr), attr
        assert getattr(theirs, "_clean_session", None) == getattr(ours, "_clean_session", None)
        for attr in ("verify_mode", "check_hostname", "protocol"):
            assert getattr(theirs._ssl_context, attr) == getattr(ours._ssl_context, attr), attr


def _paho_behaviour() -> list:
    """What paho's Properties and ReasonCode do, observably: every property on every packet type (accepted or the
    error), its encoding, the decoding of that encoding, re-use of one object (clear), and every reason code's
    name and value on every packet type."""
    from paho.mqtt.properties import Properties

    samples = {0: 1, 1: 7, 2: 70_000, 3: 300, 4: b"\x01\x02", 5: "ab", 6: ("k", "v")}
    packet_types = [*range(1, 16), PacketTypes.WILLMESSAGE]
    table = Properties(PacketTypes.PUBLISH)
    seen: list = []
    reused = {packet: Properties(packet) for packet in packet_types}  # one object per packet type, re-used
    for name, ident in table.names.items():
        kind = table.properties[ident][0]
        for packet in packet_types:
            props = Properties(packet)
            try:
                setattr(props, name, samples[kind])
                if ident in (11, 38):
                    setattr(props, name, samples[kind])  # these may repeat
                packed = props.pack()
            except Exception as exc:  # noqa: BLE001 - the refusal is the behaviour compared
                seen.append((name, packet, type(exc).__name__, str(exc)))
                continue
            decoded, length = Properties(packet).unpack(packed)
            reused[packet].unpack(packed)
            seen.append((name, packet, packed, length, decoded.json(), str(decoded), decoded.isEmpty(),
                         reused[packet].json()))
    for packet, props in reused.items():
        props.unpack(b"\x00")
        seen.append(("cleared", packet, props.json(), props.isEmpty(), str(props)))
    try:
        Properties(PacketTypes.PUBLISH).NoSuchProperty = 1
    except Exception as exc:  # noqa: BLE001
        seen.append(("unknown", type(exc).__name__, str(exc)))
    for code, names in ReasonCode.names.items():
        for packet in packet_types:
            for attempt in ({"identifier": code}, {"aName": next(iter(names))}):
                try:
                    reason = ReasonCode(packet, **attempt)
                    seen.append((code, packet, reason.value, reason.getName(), repr(reason)))
                except Exception as exc:  # noqa: BLE001
                    seen.append((code, packet, type(exc).__name__, str(exc)))
    seen.append(("default", [(ReasonCode(p).value, str(ReasonCode(p))) for p in (PacketTypes.PUBACK,
                                                                                  PacketTypes.DISCONNECT)]))
    return seen


def test_sharing_pahos_tables_changes_nothing_paho_does():
    """``share_paho_tables`` (applied by every client haarvest builds) only stops paho rebuilding constant tables:
    everything Properties and ReasonCode encode, decode, accept and refuse is what paho's own classes do."""
    was_shared = setup.share_paho_tables()
    assert was_shared, "paho's Properties/ReasonCode layout changed: the shim no longer applies"
    setup._unshare_paho_tables()
    try:
        theirs = _paho_behaviour()
        assert setup.share_paho_tables()
        assert setup.share_paho_tables()  # idempotent
        ours = _paho_behaviour()
    finally:
        setup.share_paho_tables()
    assert len(theirs) > 1000 and ours == theirs


def test_shared_tables_are_not_rebuilt_per_packet():
    from paho.mqtt import _packet
    from paho.mqtt.enums import MQTTProtocolVersion
    from paho.mqtt.properties import Properties

    setup.new_client("dev-1", mqtt.MQTTv5, persistent=False)  # applies the shim
    first, second = Properties(PacketTypes.PUBLISH), Properties(PacketTypes.PUBACK)
    assert first.names is second.names and first.properties is second.properties and first.types is second.types
    mid, reason, props = _packet._decode_mid_reason_prop(PacketTypes.PUBACK, b"\x00\x07\x10\x00",
                                                          MQTTProtocolVersion.MQTTv5)
    assert (mid, reason.value, str(reason), props.isEmpty()) == (7, 0x10, "No matching subscribers", True)
