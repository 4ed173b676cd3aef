"""MQTT transport: paho-mqtt ≥ 2.1 (callback API v2), MQTT 5 with a 3.1.1 fallback, QoS 1, persistent session.

Delivery contract (at-least-once, in order):

* The agent hands pending outbox rows to :meth:`MqttTransport.submit` in sequence order, at most
  ``max_inflight`` unacknowledged at a time. paho keeps every submitted message until its PUBACK and resends it
  (DUP) after a reconnect.
* **End to end** (``receipts = true``, the default): a PUBACK only says the broker took the message — it may
  still drop it (a full queue, a wiped session, reason code 0x10 "no matching subscribers"). A row is marked
  ``sent`` only when the coordinator's receipt (``wire.receipt_topic(device)``, :class:`protocols.wire.Receipt`,
  published after it stored the report) names it, and ``rejected`` when the receipt says it will never be stored.
  A row PUBACKed but not receipted is re-sent after ``receipt_timeout_s`` (doubling per attempt up to
  ``receipt_timeout_max_s``): no broker-side loss loses a charged report; the coordinator is idempotent.
  Without receipts a row is ``sent`` on a PUBACK with reason code 0 only. Any other PUBACK reason never marks a
  row sent: "not authorized", "topic name invalid", "packet too large", "payload format invalid" reject it for
  good, the rest (0x10, quota exceeded, server busy, …) retry it like a missing receipt. After a process restart
  every ``pending`` row is submitted again, so a report may appear twice on the wire — consumers dedupe by
  ``(device_id, seq)``.
* Callbacks run on paho's network thread. They never touch the database: they append to thread-safe deques
  (acks, incoming round configs) and set ``wake`` so the agent's thread does the durable work.
* Session: ``clean_start=False`` with a Session Expiry Interval (MQTT 5), ``clean_session=False`` (3.1.1); the
  client id is the device id. Last will: retained ``{"state": "offline"}`` on ``wire.status_topic(device)``; on
  connect the agent publishes a retained ``online`` status. Reconnects back off from ``reconnect_min_s`` to
  ``reconnect_max_s`` (paho's exponential backoff).
* ``protocol = "auto"`` starts with MQTT 5 and switches to 3.1.1 for good when the broker refuses the protocol
  version (CONNACK "unsupported protocol version" / 3.1.1 return code 1, or a closed connection before any
  CONNACK, twice in a row), or leaves an open TCP connection without any CONNACK for ``CONNACK_TIMEOUT`` seconds
  (amqtt, a 3.1.1-only broker, neither answers nor closes an MQTT 5 CONNECT that carries properties).
  The client, the session settings and the fall-back rule are :mod:`protocols.mqtt`'s.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from typing import Any

import paho.mqtt.client as mqtt

from protocols import wire
from protocols.mqtt import (FALLBACK_AFTER, first_protocol, may_fall_back, new_client, protocol_name, refuses_mqtt5,
                            session_connect_args, should_fall_back)

from .config import MqttConfig
from .state import OutboxRow

__all__ = ["MqttTransport"]

log = logging.getLogger("haarvest.agent.transport")

#: PUBACK reason codes after which the broker will never accept the message as it is: the row is rejected.
_FINAL_REFUSALS = {0x87, 0x90, 0x95, 0x99}
#: seconds an open TCP connection may go without CONNACK before ``auto`` treats it as a refusal of MQTT 5
CONNACK_TIMEOUT = 5.0


class MqttTransport:
    """One device's MQTT connection (one paho client, one paho network thread)."""

    def __init__(self, cfg: MqttConfig, device_id: str, wake: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.device_id = device_id
        self.wake = wake or threading.Event()
        self.protocol = first_protocol(cfg.protocol)
        self._acks: deque[tuple[int, int]] = deque()  # (mid, PUBACK reason code)
        self._receipts: deque[wire.Receipt] = deque()
        self._awaiting: dict[int, float] = {}  # seq → when to re-send it (PUBACKed, not receipted)
        self._timeout: dict[int, float] = {}  # seq → its current receipt timeout (doubles per re-send)
        self._receipt_topic = wire.receipt_topic(device_id)
        self._rounds: deque[bytes] = deque()
        self._mid_seq: dict[int, int] = {}
        self._inflight: set[int] = set()  # seqs handed to paho, not yet acked
        self.last_submitted = -1
        self.connected = threading.Event()
        self.connects = 0
        self.disconnects = 0
        self._version_failures = 0
        self._connack_seen = False
        self._started_at = 0.0
        self._status_extra: dict[str, Any] = {}
        self._client: mqtt.Client | None = None
        self._stopping = False
        #: (state, since wall-clock time, reason): "connecting", "connected", "disconnected" — for `agent status`
        self.link: tuple[str, float, str] = ("connecting", time.time(), "")
        self.resent = 0

    # --- lifecycle ----------------------------------------------------------------------------------------

    def _make_client(self) -> mqtt.Client:
        cfg = self.cfg
        password = cfg.password_file.read_text().strip() if cfg.username and cfg.password_file else None
        client = new_client(
            cfg.client_id or self.device_id,
            self.protocol,
            persistent=True,
            username=cfg.username,
            password=password,
            tls=cfg.tls,
            ca_certs=str(cfg.ca_file) if cfg.ca_file else None,
            certfile=str(cfg.cert_file) if cfg.cert_file else None,
            keyfile=str(cfg.key_file) if cfg.key_file else None,
            reconnect_on_failure=True,
        )
        client.max_inflight_messages_set(cfg.max_inflight)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(cfg.reconnect_min_s, cfg.reconnect_max_s)
        client.will_set(
            wire.status_topic(self.device_id),
            json.dumps({"device_id": self.device_id, "state": "offline", "clean": False}),
            qos=1,
            retain=True,
        )
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        return client

    def start(self, status: dict[str, Any] | None = None) -> None:
        """Connect asynchronously and start paho's network thread (returns at once; connection in background)."""
        self._status_extra = dict(status or {})
        self._stopping = False
        self._connack_seen = False
        self._started_at = time.monotonic()
        self._client = self._make_client()
        kwargs = session_connect_args(self.protocol, self.cfg.session_expiry_s)
        self._client.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive, **kwargs)
        self._client.loop_start()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish a clean ``offline`` status, disconnect and stop the network thread."""
        client, self._client = self._client, None
        if client is None:
            return
        self._stopping = True
        try:
            if self.connected.is_set():
                info = client.publish(
                    wire.status_topic(self.device_id),
                    json.dumps({"device_id": self.device_id, "state": "offline", "clean": True}),
                    qos=1,
                    retain=True,
                )
                deadline = time.monotonic() + timeout
                while not info.is_published() and time.monotonic() < deadline and self.connected.is_set():
                    time.sleep(0.01)
            client.disconnect()
        finally:
            client.loop_stop()
            self.connected.clear()

    def kill(self) -> None:
        """Drop the connection without a clean goodbye (tests: simulate a crash; the will is published)."""
        client, self._client = self._client, None
        if client is not None:
            self._stopping = True
            try:
                sock = client.socket()
                if sock is not None:
                    sock.close()
            finally:
                client.loop_stop()
            self.connected.clear()

    # --- paho callbacks (network thread) ------------------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        code = getattr(reason, "value", reason)
        self._connack_seen = True
        if getattr(reason, "is_failure", False) or (isinstance(code, int) and code != 0):
            log.warning("mqtt connect refused", extra={"event": "mqtt_refused", "reason": str(reason)})
            self.link = ("disconnected", time.time(), f"refused: {reason}")
            if may_fall_back(self.cfg.protocol, self.protocol) and refuses_mqtt5(reason):
                self._version_failures += FALLBACK_AFTER  # a refusal of the version: fall back at once
                self.wake.set()
            return
        self._version_failures = 0
        self.connects += 1
        self.connected.set()
        self.link = ("connected", time.time(), "")
        client.subscribe(wire.ROUNDS_CURRENT_TOPIC, qos=1)
        if self.cfg.receipts:
            client.subscribe(self._receipt_topic, qos=1)
        client.publish(
            wire.status_topic(self.device_id),
            json.dumps({"device_id": self.device_id, "state": "online", **self._status_extra}),
            qos=1,
            retain=True,
        )
        log.info(
            "mqtt connected",
            extra={"event": "mqtt_connected", "session_present": bool(getattr(flags, "session_present", False)),
                   "protocol": protocol_name(self.protocol)},
        )
        self.wake.set()

    def _on_connect_fail(self, _c: Any, _u: Any) -> None:
        """The TCP/TLS connection could not be made (paho retries with back-off): say why, at warning level."""
        where = f"{self.cfg.host}:{self.cfg.port}"
        try:  # paho does not pass the error: probe once (only on failure, at paho's back-off pace)
            with socket.create_connection((self.cfg.host, self.cfg.port), timeout=2):
                why = "TCP connects; TLS or MQTT handshake failed (certificate, CA, protocol?)"
        except OSError as exc:
            why = str(exc) or type(exc).__name__
        log.warning("mqtt cannot connect to %s: %s", where, why,
                    extra={"event": "mqtt_connect_failed", "broker": where, "reason": why})
        self.link = ("disconnected", self.link[1] if self.link[0] != "connected" else time.time(), why)
        self.wake.set()

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        was = self.connected.is_set()
        self.connected.clear()
        if was or self.link[0] == "connecting":
            self.link = ("disconnected", time.time(), str(reason))
        if not was and may_fall_back(self.cfg.protocol, self.protocol) and not self._stopping:
            self._version_failures += 1  # closed before any CONNACK: maybe a 3.1.1-only broker
        if was:
            self.disconnects += 1
        if not self._stopping:
            log.warning("mqtt disconnected", extra={"event": "mqtt_disconnected", "reason": str(reason)})
        self.wake.set()

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        code = getattr(reason, "value", reason)
        self._acks.append((mid, int(code) if isinstance(code, int) else 0))
        self.wake.set()

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == wire.ROUNDS_CURRENT_TOPIC:
            self._rounds.append(bytes(msg.payload))
            self.wake.set()
        elif msg.topic == self._receipt_topic and self.cfg.receipts:
            try:
                receipt = wire.decode_receipt(bytes(msg.payload))
            except wire.WireError as exc:
                log.warning("ignoring a malformed receipt", extra={"event": "bad_receipt", "reason": str(exc)})
                return
            if receipt.device_id == self.device_id:
                self._receipts.append(receipt)
                self.wake.set()

    # --- agent thread -------------------------------------------------------------------------------------

    def maybe_fallback(self) -> bool:
        """Switch to MQTT 3.1.1 after repeated protocol-version failures (agent thread). True if it switched."""
        if not may_fall_back(self.cfg.protocol, self.protocol):
            return False
        client = self._client
        silent = (client is not None and not self._connack_seen and client.socket() is not None
                  and time.monotonic() - self._started_at > CONNACK_TIMEOUT)
        if should_fall_back(self._version_failures, silent):
            log.warning("broker refuses MQTT 5; falling back to 3.1.1", extra={"event": "mqtt_fallback"})
            old = self._client
            self._client = None
            if old is not None:
                self._stopping = True
                old.disconnect()
                old.loop_stop()
            self.protocol = mqtt.MQTTv311
            self._mid_seq.clear()
            self._inflight.clear()
            self.last_submitted = -1  # resubmit everything pending on the new client
            self.start(self._status_extra)
            return True
        return False

    def capacity(self) -> int:
        return max(0, self.cfg.max_inflight - len(self._inflight))

    def submit(self, rows: list[OutboxRow]) -> int:
        """Hand outbox rows (in seq order) to paho; returns how many were queued."""
        client = self._client
        if client is None:
            return 0
        n = 0
        for row in rows:
            if row.seq in self._awaiting:  # PUBACKed, its receipt not yet overdue: pass over it
                self.last_submitted = max(self.last_submitted, row.seq)
                continue
            if row.seq <= self.last_submitted or row.seq in self._inflight:
                continue
            info = client.publish(row.topic, row.payload, qos=1)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                log.warning("publish not queued", extra={"event": "publish_error", "seq": row.seq, "rc": int(info.rc)})
                break
            self._mid_seq[info.mid] = row.seq
            self._inflight.add(row.seq)
            self.last_submitted = row.seq
            n += 1
        return n

    def take_acks(self) -> tuple[list[int], list[int]]:
        """(delivered seqs, rejected seqs) since the last call (module docstring: receipts, PUBACK reason codes).
        Acks of status messages are ignored."""
        sent: list[int] = []
        rejected: list[int] = []
        now = time.monotonic()
        while self._acks:
            mid, code = self._acks.popleft()
            seq = self._mid_seq.pop(mid, None)
            if seq is None:
                continue
            self._inflight.discard(seq)
            if code in _FINAL_REFUSALS:
                rejected.append(seq)
                self._timeout.pop(seq, None)
            elif code == 0 and not self.cfg.receipts:
                sent.append(seq)
            else:  # broker took it (or said 0x10, quota, busy…): wait for the receipt, re-send without one
                if code:
                    log.warning("broker accepted a report without delivering it", extra={
                        "event": "puback_not_delivered", "seq": seq, "reason_code": code})
                timeout = self._timeout.setdefault(seq, self.cfg.receipt_timeout_s)
                self._awaiting[seq] = now + timeout
        while self._receipts:
            receipt = self._receipts.popleft()
            for seq in receipt.stored:
                sent.append(seq)
                self._forget(seq)
            for seq, reason in receipt.rejected:
                rejected.append(seq)
                self._forget(seq)
                log.warning("coordinator rejected a report", extra={"event": "report_rejected", "seq": seq,
                                                                    "reason": reason})
        return sent, rejected

    def _forget(self, seq: int) -> None:
        self._awaiting.pop(seq, None)
        self._timeout.pop(seq, None)
        self._inflight.discard(seq)

    def resend_due(self) -> int:
        """Make reports whose receipt is overdue submittable again (their timeout doubles, up to the maximum);
        returns how many. Only while connected: offline, nothing could be receipted anyway."""
        if not self._awaiting or not self.connected.is_set():
            return 0
        now = time.monotonic()
        due = [seq for seq, when in self._awaiting.items() if when <= now]
        for seq in due:
            del self._awaiting[seq]
            self._timeout[seq] = min(2 * self._timeout.get(seq, self.cfg.receipt_timeout_s),
                                     self.cfg.receipt_timeout_max_s)
        if due:
            self.last_submitted = min(self.last_submitted, min(due) - 1)
            self.resent += len(due)
            log.info("re-sending reports without a receipt", extra={"event": "resend", "count": len(due),
                                                                     "first_seq": min(due)})
        return len(due)

    @property
    def awaiting_receipt(self) -> int:
        return len(self._awaiting)

    def take_rounds(self) -> list[bytes]:
        out = []
        while self._rounds:
            out.append(self._rounds.popleft())
        return out

    @property
    def inflight(self) -> int:
        return len(self._inflight)
