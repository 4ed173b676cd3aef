"""The MQTT half of ingest, run in its own process: receive reports, hand them to the coordinator in batches,
acknowledge each batch only when the coordinator says it is committed.

Why a process: paho's receive path is pure Python (acknowledgements included)
and so is the coordinator's validate-and-commit. In one process the two take turns on the GIL; in two they overlap
on two cores while the coordinator keeps one writer (the CPU per report of each configuration is measured in the
"Coordinator ingest" section of ``make bench``). The receiver knows nothing of devices, signatures or the store: it
only moves bytes and acknowledgements, and it imports nothing but paho.

paho-mqtt ≥ 2.1 (``CallbackAPIVersion.VERSION2``), QoS 1, a persistent session (the broker queues reports while the
coordinator is down) and ``manual_ack=True``. A batch closes when it is full (``batch_size``) or when its first
message is ``batch_ms`` old as the next one arrives (then in paho's network thread), or at twice ``batch_ms`` when
no further message comes (a flusher thread) — by its age only while the coordinator has room for it: while
:data:`MAX_BATCHES_IN_FLIGHT` batches await their commit, it grows up to ``batch_size`` (group commit). At most
:data:`MAX_BATCHES_IN_FLIGHT` batches wait for the coordinator's commit; the next closed batches wait in the
receiver, and the broker's in-flight window (MQTT 5's Receive Maximum, ``receive_maximum``) bounds them: paho's
network thread keeps reading, so the broker's acknowledgements of round publications and receipts are never stuck
behind a drain. Receipts are queued and handed to
paho a few hundred at a time (:data:`MAX_RECEIPTS_IN_FLIGHT`), so a round publication never waits behind them.

A message is acknowledged only if it arrived on the current connection (a *generation*): after a reconnect the
broker redelivers the earlier connection's unacknowledged messages itself, and the coordinator finds the copies
``duplicate``. The receiver dies with its coordinator: on end of file from it, it exits at once without
acknowledging anything in flight. It ignores SIGTERM and SIGINT (a service manager signals the whole group; the
coordinator stops it in order).

Protocol: ``"5"`` connects with ``clean_start=False`` and a 7-day session expiry; ``"3.1.1"`` with
``clean_session=False``; ``"auto"`` tries MQTT 5 and falls back to 3.1.1 for good when the broker refuses the protocol
version or closes the connection before any CONNACK. MQTT 5 is the default because its PUBACK reason codes tell
``coordinator rounds open`` that the broker's ACL refused a round. It had cost the receiver about twice the CPU of
MQTT 3.1.1, until :func:`protocols.mqtt.share_paho_tables` (which :func:`protocols.mqtt.new_client` applies) stopped
paho rebuilding its MQTT 5 tables for every packet; the fleet-scale section of ``make bench`` measures both. Shared
subscriptions ``$share/<group>/...`` let several coordinators split a fleet (mosquitto ≥ 1.6 grants them to MQTT 3.1.1
clients too; amqtt has none). The client settings and the fall-back rule are :mod:`protocols.mqtt`'s (shared with the
device and the round publisher); the receiver process imports only it and paho — no numpy, pydantic or cryptography (a
test checks).

The pipe (a socketpair carrying pickled tuples, :class:`multiprocessing.connection.Connection`):

* coordinator → receiver: ``("settings", dict)`` first; ``("done", batch_id, receipts)`` — committed: acknowledge it, then
  publish ``receipts`` (``[(topic, payload)]``, QoS 1, not retained: what each device may stop re-sending);
  ``("publish", request, topic, payload, retain, qos, timeout)``; ``("stop", drain)`` — with ``drain``, hand over
  what is pending and wait (≤ ``drain_timeout``, default :data:`DRAIN_TIMEOUT`) for its ``done``; then disconnect
  and exit.
* receiver → coordinator: ``("status", connected, protocol)``, ``("subscribed",)``,
  ``("batch", batch_id, [(topic, payload), ...])``, ``("published", request, error or None)``, ``("stopped",)``.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from coordinator import defaults
from protocols import mqtt as mqtt_setup

__all__ = ["IngestSettings", "Receiver", "new_client", "subscription_topic", "REPORTS_WILDCARD"]

log = logging.getLogger(__name__)

#: ``protocols.wire.REPORTS_WILDCARD`` (kept here so that the receiver imports nothing but paho; a test checks it).
REPORTS_WILDCARD = "haarvest/v1/reports/+"
#: Seconds the broker keeps the session (subscription + queued QoS 1 reports) after a disconnect.
SESSION_EXPIRY = 7 * 24 * 3600
#: Batches handed to the coordinator and not yet committed, at most (one committing, the next ones queued). Closed
#: batches past it wait in the receiver — paho's network thread never waits for the coordinator (it must keep reading
#: the broker's acknowledgements of round publications and receipts) — unless the receiver holds ``receive_maximum``
#: messages or more, which only a broker that ignores MQTT 5's Receive Maximum (or an MQTT 3.1.1 session with an
#: unbounded in-flight window) can make it: then the network thread waits, and the broker holds the rest.
MAX_BATCHES_IN_FLIGHT = 3
#: Receipts waiting to be published, at most: past it a receipt is dropped and counted (its device re-sends and is
#: receipted as a duplicate).
MAX_RECEIPTS_QUEUED = 10_000
#: Receipts published and not yet acknowledged by the broker, at most. paho's own in-flight window is off
#: (``max_inflight_messages_set(0)``: every publish goes out at once), so this bound is what keeps an unbounded
#: receipt backlog from exhausting paho's 65,535 message ids (ERR_QUEUE_SIZE, seen once) and from crowding a round
#: publication (in the fleet-scale bench a publication queued behind a drain's receipts in paho's window, long
#: enough for the coordinator's start-up republication to time out). paho's window is off because with one, every
#: acknowledgement scans every message in flight for a queued one (``Client._update_inflight``): with hundreds of
#: receipts in flight, a large share of the receiver's CPU in a drain (py-spy).
MAX_RECEIPTS_IN_FLIGHT = 500
#: On a draining stop, how long to wait for the coordinator to commit what was handed over.
DRAIN_TIMEOUT = 20.0
#: ``protocol="auto"``: a TCP connection without CONNACK for this long counts as a refusal of MQTT 5 (amqtt
#: neither answers nor closes an MQTT 5 CONNECT with properties).
CONNACK_TIMEOUT = 3.0


def subscription_topic(shared_group: str | None = None) -> str:
    """``haarvest/v1/reports/+``, or ``$share/<group>/haarvest/v1/reports/+`` for a shared subscription."""
    if shared_group is None:
        return REPORTS_WILDCARD
    if not shared_group or any(c in shared_group for c in "/+#"):
        raise ValueError(f"bad shared-subscription group {shared_group!r}")
    return f"$share/{shared_group}/{REPORTS_WILDCARD}"


@dataclass
class IngestSettings:
    host: str = defaults.MQTT_HOST
    port: int = defaults.MQTT_PORT
    client_id: str = defaults.CLIENT_ID
    shared_group: str | None = None
    batch_size: int = defaults.BATCH_SIZE
    batch_ms: float = defaults.BATCH_MS
    keepalive: int = 30
    receive_maximum: int = defaults.RECEIVE_MAXIMUM
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None  # CA file; given (or tls_cert, or tls) → TLS
    tls_cert: str | None = None  # client certificate (PEM), presented to the broker; with tls_key
    tls_key: str | None = None  # the client certificate's private key (PEM)
    tls: bool = False  # TLS with the system's CAs when no tls_ca is given
    protocol: str = defaults.MQTT_PROTOCOL  # "5", "3.1.1" (cheaper per message; amqtt) or "auto"
    drain_timeout: float = DRAIN_TIMEOUT  # a draining stop waits this long for what was handed over to commit

    @property
    def first_protocol(self) -> int:
        """The MQTT version the client connects with first: 3.1.1 (4) if asked for, else 5 (``"auto"`` starts
        there)."""
        return mqtt_setup.first_protocol(self.protocol)

    @property
    def use_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    def check(self) -> None:
        """ValueError for settings that cannot work."""
        if self.batch_size < 1 or self.batch_ms <= 0:
            raise ValueError("batch_size must be >= 1 and batch_ms > 0")
        if self.protocol not in ("5", "3.1.1", "auto"):
            raise ValueError(f"protocol must be '5', '3.1.1' or 'auto', got {self.protocol!r}")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must be >= 0")
        if self.tls_key is not None and self.tls_cert is None:
            raise ValueError("tls_key without tls_cert")
        subscription_topic(self.shared_group)


def new_client(settings: IngestSettings, protocol: int) -> mqtt.Client:
    """The paho client ``settings`` describe (persistent session, manual acknowledgements, TLS), not connected
    (:func:`protocols.mqtt.new_client`).

    The coordinator builds one and discards it before it starts the receiver, so that a bad TLS file or option
    raises there and then rather than in the receiver process."""
    client = mqtt_setup.new_client(settings.client_id, protocol, persistent=True, username=settings.username,
                                   password=settings.password, tls=settings.use_tls, ca_certs=settings.tls_ca,
                                   certfile=settings.tls_cert, keyfile=settings.tls_key, manual_ack=True)
    client.max_queued_messages_set(0)
    client.max_inflight_messages_set(0)  # no paho window: MAX_RECEIPTS_IN_FLIGHT bounds what is in flight
    client.reconnect_delay_set(0.1, 5)
    return client


class Receiver:
    """The receiving end: one paho client, the batches in flight, and the pipe to the coordinator."""

    def __init__(self, settings: IngestSettings, conn: Connection) -> None:
        settings.check()
        self.settings = settings
        self.conn = conn
        self.topic = subscription_topic(settings.shared_group)
        self._send_lock = threading.Lock()
        self._batch_lock = threading.Lock()  # the pending batch; batches leave one at a time, in arrival order
        self._pending: list[tuple[str, bytes, int, int, int]] = []  # topic, payload, mid, qos, generation
        self._pending_since = 0.0
        self._batch_s = settings.batch_ms / 1000.0
        self._in_flight: dict[int, list[tuple[int, int, int]]] = {}  # batch id → (mid, qos, generation)
        self._ready: collections.deque[list[tuple[str, bytes, int, int, int]]] = collections.deque()  # closed, unsent
        self._ready_messages = 0
        self._room = threading.Condition()  # _in_flight, _ready; batches are sent under it (in order)
        self._next_batch = 0
        self._generation = 0
        self._stopping = threading.Event()
        self._abandoned = False
        self._ack_lock = threading.Lock()  # the connection generation, and the PUBACKs sent under it
        self._client_lock = threading.Lock()  # the client object (replaced once by the MQTT 3.1.1 fall-back)
        self._flush_thread = threading.Thread(target=self._flusher, name="haarvest-receiver-flush", daemon=True)
        self.protocol = settings.first_protocol
        self._version_failures = 0
        self._connacked = False
        self._receipt_lock = threading.Lock()  # never held while calling paho (its callbacks take this lock)
        self._receipt_queue: collections.deque[tuple[str, bytes]] = collections.deque()  # not yet published
        self._receipts_out = 0  # receipts handed to paho and not yet acknowledged by the broker
        self._receipt_mids: set[int] = set()  # their message ids, once publish() has returned them
        self._early_acks: set[int] = set()  # acknowledged before publish() returned (or not a receipt)
        self.receipts_dropped = 0
        self.client = self._make_client()

    # ------------------------------------------------------------------ the pipe
    def _send(self, msg: tuple) -> None:
        try:
            with self._send_lock:
                self.conn.send(msg)
        except OSError:
            self._coordinator_gone()

    def _coordinator_gone(self) -> None:
        """The coordinator died: exit now, acknowledging nothing (the broker redelivers what was in flight)."""
        os._exit(1)

    # ------------------------------------------------------------------ the MQTT client
    def _make_client(self) -> mqtt.Client:
        client = new_client(self.settings, self.protocol)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        return client

    def _connect_async(self) -> None:
        self.client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive,
                                  **mqtt_setup.session_connect_args(self.protocol, SESSION_EXPIRY,
                                                                    self.settings.receive_maximum))

    def start(self) -> None:
        """Connect and subscribe (paho's network thread) and return at once; reports ``subscribed`` over the pipe.
        With ``protocol="auto"`` a thread watches the first connection and falls back to MQTT 3.1.1 when the broker
        refuses MQTT 5 (while the broker is unreachable it keeps waiting; the pipe is served meanwhile)."""
        self._flush_thread.start()
        self._connect_async()
        self.client.loop_start()
        if self.settings.protocol == "auto":
            threading.Thread(target=self._detect_protocol, name="haarvest-receiver-auto", daemon=True).start()

    def _detect_protocol(self) -> None:
        connected_at: float | None = None  # first time a TCP connection exists without a CONNACK yet
        while not self._connacked and not self._stopping.is_set():
            if self.client.socket() is None:
                connected_at = None  # no connection (the broker down, or a retry pending): nothing to judge yet
            elif connected_at is None:
                connected_at = time.monotonic()
            silent = connected_at is not None and time.monotonic() - connected_at > CONNACK_TIMEOUT
            if mqtt_setup.should_fall_back(self._version_failures, silent):
                self._fall_back()
                return
            time.sleep(0.05)

    def _fall_back(self) -> None:
        """Switch to MQTT 3.1.1 for good (the broker does not speak MQTT 5)."""
        with self._client_lock:
            if self._stopping.is_set():
                return
            log.warning("broker refused MQTT 5: falling back to MQTT 3.1.1")
            old = self.client
            old.loop_stop()
            try:
                old.disconnect()
            except Exception:  # noqa: BLE001 - the old connection is being discarded
                pass
            self.protocol = mqtt.MQTTv311
            self.client = self._make_client()
            self._connect_async()
            self.client.loop_start()

    # ------------------------------------------------------------------ paho callbacks (network thread)
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # noqa: ANN001
        if reason_code.is_failure:
            if mqtt_setup.refuses_mqtt5(reason_code):
                self._version_failures += 1
            log.warning("MQTT connect refused: %s", reason_code)
            return
        self._connacked = True
        with self._ack_lock:
            self._generation += 1  # what the earlier connections delivered is never acknowledged on this one
        self._send(("status", True, self.protocol))
        if self.protocol == mqtt.MQTTv5:
            client.subscribe(self.topic, options=SubscribeOptions(qos=1))
        else:
            client.subscribe(self.topic, qos=1)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # noqa: ANN001
        if all(not rc.is_failure for rc in reason_codes):
            self._send(("subscribed",))
        else:
            log.error("subscription to %s refused: %s", self.topic, reason_codes)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:  # noqa: ANN001
        if not self._connacked:
            self._version_failures += 1  # closed before any CONNACK: e.g. a 3.1.1-only broker seeing MQTT 5
        self._send(("status", False, self.protocol))

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:  # noqa: ANN001
        with self._receipt_lock:
            receipt = mid in self._receipt_mids
            if receipt:
                self._receipt_mids.discard(mid)
                self._receipts_out -= 1
            else:
                if len(self._early_acks) > 10_000:  # round publications' ids, never claimed by a receipt
                    self._early_acks.clear()
                self._early_acks.add(mid)
        if receipt:
            self._pump_receipts()

    def _on_message(self, client, userdata, msg) -> None:  # noqa: ANN001
        if self._stopping.is_set():
            return  # not acknowledged: the broker redelivers it to the next session
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = ""
        with self._batch_lock:
            now = time.monotonic()
            if not self._pending:
                self._pending_since = now
            self._pending.append((topic, msg.payload, msg.mid, msg.qos, self._generation))
            if len(self._pending) >= self.settings.batch_size or (now - self._pending_since >= self._batch_s
                                                                   and self._has_room()):
                self._hand_over_locked()

    # ------------------------------------------------------------------ batches
    def _flusher(self) -> None:
        """Hand over a pending batch that no further message came to close, once its first message is twice
        ``batch_ms`` old (under load the network thread does it at ``batch_ms``); on stop, what is pending."""
        while True:
            stopping = self._stopping.wait(self._batch_s / 2)
            with self._batch_lock:
                if self._pending and (stopping or (time.monotonic() - self._pending_since >= 2 * self._batch_s
                                                   and self._has_room())):
                    self._hand_over_locked()
            if stopping:
                return

    def _has_room(self) -> bool:
        """Whether the coordinator would take a batch now (fewer than :data:`MAX_BATCHES_IN_FLIGHT` uncommitted and
        none waiting here). While it has none, the pending batch is not closed by its age: it keeps growing up to
        ``batch_size`` (group commit — a drain's commits are full batches, whose cost per report is far lower: a
        commit writes every index page its reports touched, and random device ids touch about one page per
        report)."""
        with self._room:
            return len(self._in_flight) < MAX_BATCHES_IN_FLIGHT and not self._ready

    def _hand_over_locked(self) -> None:
        """Close the pending batch: it is sent to the coordinator at once if fewer than
        :data:`MAX_BATCHES_IN_FLIGHT` wait for their commit, else when one commits (:meth:`_dispatch_locked`)."""
        batch, self._pending = self._pending, []
        with self._room:
            while self._ready_messages >= self.settings.receive_maximum and not self._abandoned:
                self._room.wait(0.1)  # an unbounded broker window: hold the network thread, the broker the rest
            if self._abandoned:
                return  # stopping without draining: never acknowledged, the broker redelivers it
            self._ready.append(batch)
            self._ready_messages += len(batch)
            self._dispatch_locked()

    def _dispatch_locked(self) -> None:
        """Send closed batches, in arrival order, while fewer than :data:`MAX_BATCHES_IN_FLIGHT` are uncommitted
        (the caller holds ``_room``)."""
        while self._ready and len(self._in_flight) < MAX_BATCHES_IN_FLIGHT and not self._abandoned:
            batch = self._ready.popleft()
            self._ready_messages -= len(batch)
            batch_id = self._next_batch
            self._next_batch += 1
            self._in_flight[batch_id] = [(mid, qos, gen) for _, _, mid, qos, gen in batch]
            self._send(("batch", batch_id, [(topic, payload) for topic, payload, _, _, _ in batch]))
            self._room.notify_all()

    def _settle(self, batch_id: int) -> None:
        """The coordinator committed ``batch_id``: acknowledge what of it arrived on the current connection."""
        with self._room:
            acks = self._in_flight.pop(batch_id, [])
            self._dispatch_locked()
            self._room.notify_all()
        with self._ack_lock:  # no reconnect between reading the generation and queueing the PUBACKs
            generation = self._generation
            for mid, qos, gen in acks:
                if qos > 0 and gen == generation:
                    self.client.ack(mid, qos)

    def _receipts(self, receipts: list[tuple[str, bytes]]) -> None:
        """Queue a committed batch's receipts for publication (QoS 1, fire and forget: a lost receipt only makes its
        device re-send, and the copy is receipted as a duplicate). At most :data:`MAX_RECEIPTS_QUEUED` wait; receipts
        past it are dropped and counted (``receipts_dropped``)."""
        with self._receipt_lock:
            room = max(MAX_RECEIPTS_QUEUED - len(self._receipt_queue), 0)
            self._receipt_queue.extend(receipts[:room])
            self.receipts_dropped += max(len(receipts) - room, 0)
        self._pump_receipts()

    def _pump_receipts(self) -> None:
        """Hand queued receipts to paho while fewer than :data:`MAX_RECEIPTS_IN_FLIGHT` await the broker's
        acknowledgement (called after a batch's receipts are queued, and on each acknowledgement of a receipt)."""
        while True:
            with self._receipt_lock:
                if not self._receipt_queue or self._receipts_out >= MAX_RECEIPTS_IN_FLIGHT:
                    return
                topic, payload = self._receipt_queue.popleft()
                self._receipts_out += 1
            try:
                info = self.client.publish(topic, payload, qos=1)
            except Exception:  # noqa: BLE001 - never let a receipt stop ingest
                log.exception("receipt to %s not published", topic)
                info = None
            with self._receipt_lock:
                if info is None or info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                    self._receipts_out -= 1
                    self.receipts_dropped += 1
                elif info.mid in self._early_acks:  # acknowledged before publish() returned
                    self._early_acks.discard(info.mid)
                    self._receipts_out -= 1
                else:
                    self._receipt_mids.add(info.mid)

    # ------------------------------------------------------------------ the coordinator's requests
    def _publish(self, request: int, topic: str, payload: bytes, retain: bool, qos: int, timeout: float) -> None:
        error = None
        try:
            self.client.publish(topic, payload, qos=qos, retain=retain).wait_for_publish(timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator, which raises it
            error = f"{type(exc).__name__}: {exc}"
        self._send(("published", request, error))

    def serve(self) -> None:
        """Answer the coordinator until it says stop (or dies). A draining stop lets the flusher hand over what is
        pending and waits (≤ ``drain_timeout``) until every batch handed over is committed and acknowledged."""
        drain_deadline: float | None = None
        while True:
            if drain_deadline is not None:
                with self._room:
                    drained = not self._in_flight and not self._ready and not self._flush_thread.is_alive()
                if drained or time.monotonic() > drain_deadline:
                    if not drained:
                        log.warning("stopping with %d batches uncommitted: not acknowledged, the broker redelivers "
                                    "them", len(self._in_flight) + len(self._ready))
                    break
                if not self.conn.poll(0.05):
                    continue
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self._coordinator_gone()
            kind = msg[0]
            if kind == "done":
                self._settle(msg[1])
                self._receipts(msg[2] if len(msg) > 2 else [])
            elif kind == "publish":
                threading.Thread(target=self._publish, args=msg[1:], daemon=True).start()
            elif kind == "stop":
                self._stopping.set()
                if not msg[1]:
                    break
                drain_deadline = time.monotonic() + self.settings.drain_timeout
        with self._room:
            self._abandoned = True  # a network thread waiting for room gives up its batch (not acknowledged)
            self._room.notify_all()
        self._stopping.set()
        with self._client_lock:
            self.client.disconnect()
            self.client.loop_stop()
        self._send(("stopped",))


def main(argv: list[str] | None = None) -> int:
    """``python -m coordinator.mqtt_receiver <fd>``: serve the coordinator on the socket at file descriptor ``fd``."""
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="haarvest mqtt receiver: %(levelname)s %(message)s")
    conn = Connection(socket.socket(fileno=int(argv[0])).detach())
    kind, values = conn.recv()
    if kind != "settings":
        raise RuntimeError(f"the mqtt receiver expects its settings first on the socket, got a {kind!r} message")
    receiver = Receiver(IngestSettings(**values), conn)
    receiver.start()
    receiver.serve()
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
