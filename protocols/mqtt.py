"""MQTT client setup shared by the device and the coordinator: protocol versions, the MQTT 5 → 3.1.1 fall-back, and
one paho client factory (paho-mqtt ≥ 2.1, ``CallbackAPIVersion.VERSION2``).

Used by :mod:`edge_agent.transport` (the device's connection) and ``coordinator rounds`` (:mod:`coordinator.cli`,
the round publisher). :mod:`coordinator.mqtt_receiver` imports nothing but paho (a separate, light process), so it
repeats the few settings it needs; ``tests/protocols/test_mqtt.py`` checks that they agree with this module.

**Protocol settings** (the ``protocol`` option of both sides): ``"5"``, ``"3.1.1"``, or ``"auto"`` — MQTT 5 first,
then 3.1.1 (:data:`ATTEMPTS`, :func:`attempts`).

**What each version gives a persistent session** (:func:`new_client` with ``persistent=True``, then
:func:`session_connect_args`):

* MQTT 5 (OASIS Standard, 7 March 2019): ``Clean Start = 0`` (§3.1.2.4) with a *Session Expiry Interval* CONNECT
  property (§3.1.2.11.2): the broker keeps the session — subscriptions and queued QoS 1 messages — for that many
  seconds after a disconnect, and no longer. Its PUBACKs and CONNACKs carry reason codes (e.g. 0x87 "Not
  authorized", 0x10 "No matching subscribers").
* MQTT 3.1.1 (OASIS Standard, 29 October 2014): ``CleanSession = 0`` (§3.1.2.4): the broker keeps the session
  until it discards it by its own policy (the client cannot set an expiry); a PUBACK says only "received".

**Falling back.** A broker that does not speak MQTT 5 refuses its CONNECT with the CONNACK reason code 0x84
"Unsupported Protocol Version" (MQTT 5.0 §3.2.2.2, Table 3-1; a server MAY send it, then MUST close the connection,
[MQTT-3.1.2-2]) or, as a 3.1.1 server must ([MQTT-3.1.2-2] of 3.1.1), with the CONNACK return code 1 "Connection
Refused, unacceptable protocol version" (MQTT 3.1.1 §3.2.2.3). paho reports the latter on an MQTT 5 connection as
reason 0x84 too; both are in :data:`UNSUPPORTED_VERSION` (:func:`refuses_mqtt5`). Some brokers instead close the
connection before any CONNACK, or (amqtt) neither answer nor close an MQTT 5 CONNECT that carries properties: the
callers count such closes and time out a silent connection, and :func:`should_fall_back` is the one rule on those
counts. Only ``"auto"`` on its MQTT 5 attempt may fall back (:func:`may_fall_back`); it switches for good.

**paho's MQTT 5 objects, made cheap** (:func:`share_paho_tables`, applied by :func:`new_client`). paho 2.x builds a
``Properties`` object for every PUBLISH and PUBACK it decodes (and a ``ReasonCode`` for every PUBACK), and each one
rebuilds paho's constant tables — property names, types and the packets each applies to, 27 entries each, and a
copy of the 43 reason codes — then scans them all to clear itself before decoding. On this machine, at 91 ns per
step of a fixed Python loop, ``Properties()`` took 11.3 µs, unpacking an empty property block 5.8 µs and
``ReasonCode()`` 4.2 µs: 17 µs for a report's PUBLISH and 17 µs for its receipt's PUBACK, most of why the
coordinator's MQTT 5 receiver cost twice its MQTT 3.1.1 one. The shim makes every instance share the tables paho's
own constructor builds (nothing writes to them: they are looked up only) and clears only the property attributes
that can exist; what paho encodes, decodes, accepts and refuses is unchanged (``tests/protocols/test_mqtt.py``
checks it against paho's own classes, for every property and reason code). It applies only to the paho versions
that test has compared (:data:`PAHO_VERSIONS`) with the layout it knows, and leaves any other alone.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import paho.mqtt
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["PROTOCOLS", "ATTEMPTS", "UNSUPPORTED_VERSION", "FALLBACK_AFTER", "attempts", "first_protocol",
           "protocol_name", "refuses_mqtt5", "may_fall_back", "should_fall_back", "new_client",
           "session_connect_args", "share_paho_tables"]

#: MQTT version name → paho's protocol constant.
PROTOCOLS: dict[str, int] = {"5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
#: protocol setting → the versions to try, in order.
ATTEMPTS: dict[str, tuple[int, ...]] = {"5": (mqtt.MQTTv5,), "3.1.1": (mqtt.MQTTv311,),
                                        "auto": (mqtt.MQTTv5, mqtt.MQTTv311)}
#: CONNACK codes meaning "this broker does not speak MQTT 5": MQTT 5 reason 0x84, MQTT 3.1.1 return code 1.
UNSUPPORTED_VERSION = frozenset({1, 0x84})
#: Protocol-version failures (a close before any CONNACK counts one) after which ``"auto"`` falls back to 3.1.1.
FALLBACK_AFTER = 2


def attempts(setting: str) -> tuple[int, ...]:
    """The paho protocol versions to try, in order, for a protocol setting (``"5"``, ``"3.1.1"`` or ``"auto"``)."""
    try:
        return ATTEMPTS[setting]
    except KeyError:
        raise ValueError(f"MQTT protocol must be one of {', '.join(map(repr, ATTEMPTS))}, got {setting!r}") from None


def first_protocol(setting: str) -> int:
    """The version a client with this setting connects with first (``"auto"`` starts with MQTT 5)."""
    return attempts(setting)[0]


def protocol_name(protocol: int) -> str:
    """``"5"`` or ``"3.1.1"`` for paho's protocol constant (logs and status)."""
    return "5" if protocol == mqtt.MQTTv5 else "3.1.1"


def refuses_mqtt5(reason: Any) -> bool:
    """Whether a CONNACK reason (paho ``ReasonCode`` or a plain int) says the broker does not speak MQTT 5."""
    return getattr(reason, "value", reason) in UNSUPPORTED_VERSION


def may_fall_back(setting: str, protocol: int) -> bool:
    """Whether a client with this setting, now on ``protocol``, may still switch to MQTT 3.1.1: ``"auto"`` on MQTT 5."""
    return setting == "auto" and protocol == mqtt.MQTTv5


def should_fall_back(version_failures: int, silent: bool = False) -> bool:
    """Whether to switch to MQTT 3.1.1 now: :data:`FALLBACK_AFTER` protocol-version failures, or a connection that
    stayed open without any CONNACK past the caller's timeout (``silent``). Ask only when :func:`may_fall_back`."""
    return version_failures >= FALLBACK_AFTER or silent


#: paho-mqtt releases :func:`share_paho_tables` applies to: those its test has compared with paho's own classes.
PAHO_VERSIONS = ("2.1.", "2.2.")
#: The attributes paho 2.1–2.2's ``Properties.__init__`` sets: its packet type and three constant tables.
_PROPERTIES_LAYOUT = ("packetType", "types", "names", "properties")
_shared: dict[str, Any] = {}


def share_paho_tables() -> bool:
    """Make paho's ``Properties`` instances share paho's constant tables rather than rebuild them per packet, and
    ``ReasonCode`` copy its table from a plain dict (see the module docstring); idempotent. Returns whether the shim
    is in place: False, and nothing changed, for another paho release or layout."""
    if _shared:
        return True
    if not paho.mqtt.__version__.startswith(PAHO_VERSIONS):
        return False
    prototype = Properties(PacketTypes.PUBLISH)  # built by paho's own constructor
    if tuple(vars(prototype)) != _PROPERTIES_LAYOUT or not isinstance(ReasonCode.__dict__.get("names"), Mapping):
        return False
    tables = {key: vars(prototype)[key] for key in _PROPERTIES_LAYOUT[1:]}
    compressed = tuple(name.replace(" ", "") for name in tables["names"])

    def __init__(self: Properties, packetType: int) -> None:
        state = vars(self)
        state["packetType"] = packetType
        state.update(tables)

    def clear(self: Properties) -> None:
        state = vars(self)
        if len(state) > len(_PROPERTIES_LAYOUT):  # property attributes are the only others
            for name in compressed:
                state.pop(name, None)

    _shared.update(properties_init=Properties.__init__, properties_clear=Properties.clear,
                   reason_names=ReasonCode.__dict__["names"])
    Properties.__init__ = __init__  # type: ignore[method-assign]
    Properties.clear = clear  # type: ignore[method-assign]
    # paho's ReasonCode.__init__ copies this table (dict(type(self).names)): from a read-only mapping proxy that copy
    # goes through the generic mapping protocol (3.3 µs), from a dict it is one C call (0.4 µs).
    ReasonCode.names = dict(ReasonCode.__dict__["names"])
    return True


def _unshare_paho_tables() -> None:
    """Undo :func:`share_paho_tables` (for the test that compares the shim with paho's own classes)."""
    if _shared:
        Properties.__init__ = _shared["properties_init"]  # type: ignore[method-assign]
        Properties.clear = _shared["properties_clear"]  # type: ignore[method-assign]
        ReasonCode.names = _shared["reason_names"]
        _shared.clear()


def new_client(client_id: str, protocol: int, *, persistent: bool, username: str | None = None,
               password: str | None = None, tls: bool = False, ca_certs: str | None = None,
               certfile: str | None = None, keyfile: str | None = None, **client_kwargs: Any) -> mqtt.Client:
    """A paho client (callback API v2), not connected.

    ``persistent``: keep the session across connections — MQTT 3.1.1 ``clean_session=False`` here; for MQTT 5 connect
    with :func:`session_connect_args` (clean start off, a session expiry). Otherwise paho's defaults (a clean 3.1.1
    session; MQTT 5 clean start on the first connection). ``username`` (when non-empty) with ``password``. ``tls``:
    TLS with the broker's certificate and host name verified against ``ca_certs`` (the system's CAs when None),
    presenting ``certfile``/``keyfile`` when given. ``client_kwargs`` go to ``paho.mqtt.client.Client``
    (``manual_ack``, ``reconnect_on_failure``, …)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                         clean_session=False if persistent and protocol == mqtt.MQTTv311 else None, **client_kwargs)
    share_paho_tables()
    if username:
        client.username_pw_set(username, password)
    if tls:
        client.tls_set(ca_certs=ca_certs, certfile=certfile, keyfile=keyfile, cert_reqs=ssl.CERT_REQUIRED,
                       tls_version=ssl.PROTOCOL_TLS_CLIENT)
    return client


def session_connect_args(protocol: int, session_expiry_s: float, receive_maximum: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``connect``/``connect_async`` for a persistent session: MQTT 5 ``clean_start=False`` and a
    Session Expiry Interval of ``session_expiry_s`` seconds (and a Receive Maximum when given); none for MQTT 3.1.1
    (its persistence is the client's ``clean_session=False``, :func:`new_client`)."""
    if protocol != mqtt.MQTTv5:
        return {}
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = int(session_expiry_s)
    if receive_maximum is not None:
        props.ReceiveMaximum = receive_maximum
    return {"clean_start": False, "properties": props}
