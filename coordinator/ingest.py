"""MQTT ingest: subscribe to device reports, validate, commit durably in batches, and only then acknowledge.

paho-mqtt ≥ 2.1 (``CallbackAPIVersion.VERSION2``), QoS 1, a persistent session (so the broker queues reports
while the coordinator is down) and ``manual_ack=True``. Messages collect in a batch; the batch is validated
(:meth:`coordinator.validate.Validator.check_batch`), committed in one transaction
(:meth:`coordinator.store.Store.commit_batch`) and only then are the PUBACKs of the whole batch sent — accepted,
duplicate and rejected alike. A crash before the commit loses nothing (the broker redelivers the unacknowledged
messages); a crash between commit and PUBACK makes the redelivered copies ``duplicate`` (acknowledged, not
stored again).

Threads: a batch that is full (``batch_size``) or whose first message is ``batch_ms`` old when the next one
arrives is processed right in paho's network thread; a flusher thread processes a batch that no further message
came to close (at twice ``batch_ms``). Under load the network thread does all the work with no hand-off between
threads (measured: handing every message to a worker thread through a queue cost ≈ 30–40 µs of CPU per message in
GIL switches, a third of the whole per-report cost), and while a batch commits the broker holds the next
messages. Batches are processed one at a time, in arrival order.

Protocol: ``"5"`` (default) connects with ``clean_start=False`` and a 7-day session expiry; ``"3.1.1"`` with
``clean_session=False`` (the broker keeps the session until it is cleaned); ``"auto"`` tries MQTT 5 and falls back
to 3.1.1 for good when the broker refuses the protocol version or closes the connection before any CONNACK. The
ingest guarantees are the same. MQTT 3.1.1 is the throughput setting: paho's receive path costs ≈ 54 µs per
message with it against ≈ 75 µs with MQTT 5 (whose per-packet property parsing is pure Python; see
``docs/bench.md``). MQTT 5 stays the default because the coordinator's *publishers* need it: only MQTT 5 PUBACKs
carry the reason code that tells ``coordinator rounds open`` the broker's ACL refused a round.

Several workers can split a fleet with a shared subscription ``$share/<group>/...`` (an MQTT 5 feature that
mosquitto ≥ 1.6 also grants MQTT 3.1.1 clients; amqtt has none) over a shared store (e.g. PostgreSQL).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from coordinator.metrics import Metrics
from coordinator.store import Store, StoredReport
from coordinator.validate import DUPLICATE, Validator
from protocols import wire

__all__ = ["IngestSettings", "IngestWorker", "subscription_topic"]

log = logging.getLogger(__name__)

#: Seconds the broker keeps the session (subscription + queued QoS 1 reports) after a disconnect.
SESSION_EXPIRY = 7 * 24 * 3600
#: Back-off between attempts at a batch that failed (the store unavailable): first wait, and the cap.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0


def subscription_topic(shared_group: str | None = None) -> str:
    """``haarvest/v1/reports/+``, or ``$share/<group>/haarvest/v1/reports/+`` for a shared subscription."""
    if shared_group is None:
        return wire.REPORTS_WILDCARD
    if not shared_group or any(c in shared_group for c in "/+#"):
        raise ValueError(f"bad shared-subscription group {shared_group!r}")
    return f"$share/{shared_group}/{wire.REPORTS_WILDCARD}"


@dataclass
class IngestSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str = "haarvest-coordinator"
    shared_group: str | None = None
    batch_size: int = 1000
    batch_ms: float = 20.0
    keepalive: int = 30
    receive_maximum: int = 10000
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None  # CA file; given (or tls_cert, or tls) → TLS
    tls_cert: str | None = None  # client certificate (PEM), presented to the broker; with tls_key
    tls_key: str | None = None  # the client certificate's private key (PEM)
    tls: bool = False  # TLS with the system's CAs when no tls_ca is given
    protocol: str = "5"  # "5", "3.1.1" (cheaper per message; amqtt) or "auto"

    @property
    def use_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None


#: CONNACK codes meaning "unsupported protocol version" (3.1.1 return code 1, MQTT 5 reason 0x84).
_UNSUPPORTED_VERSION = {1, 0x84}
#: ``protocol="auto"``: a TCP connection without CONNACK for this long counts as a refusal of MQTT 5 (amqtt
#: neither answers nor closes an MQTT 5 CONNECT with properties).
CONNACK_TIMEOUT = 3.0


@dataclass
class _Msg:
    topic: str
    payload: bytes
    mid: int
    qos: int
    generation: int


class IngestWorker:
    """One MQTT ingest worker (network thread from paho, one validate-and-commit thread)."""

    def __init__(self, settings: IngestSettings, store: Store, validator: Validator, metrics: Metrics | None = None) -> None:
        if settings.batch_size < 1 or settings.batch_ms <= 0:
            raise ValueError("batch_size must be >= 1 and batch_ms > 0")
        self.settings = settings
        self.store = store
        self.validator = validator
        self.metrics = metrics or Metrics()
        self.topic = subscription_topic(settings.shared_group)
        self._pending: list[_Msg] = []
        self._pending_since = 0.0  # monotonic time of the first message of the pending batch
        self._batch_s = settings.batch_ms / 1000.0
        self._batch_lock = threading.Lock()  # the pending batch, and processing (one batch at a time, in order)
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribed = threading.Event()
        if settings.protocol not in ("5", "3.1.1", "auto"):
            raise ValueError(f"protocol must be '5', '3.1.1' or 'auto', got {settings.protocol!r}")
        if settings.tls_key is not None and settings.tls_cert is None:
            raise ValueError("tls_key without tls_cert")
        self.protocol = mqtt.MQTTv311 if settings.protocol == "3.1.1" else mqtt.MQTTv5
        self._version_failures = 0
        self._connacked = False
        self.client = self._make_client()

    def _make_client(self) -> mqtt.Client:
        s = self.settings
        v5 = self.protocol == mqtt.MQTTv5
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=s.client_id, protocol=self.protocol,
                             clean_session=None if v5 else False, manual_ack=True)
        client.max_queued_messages_set(0)
        if s.username:
            client.username_pw_set(s.username, s.password)
        if s.use_tls:
            client.tls_set(ca_certs=s.tls_ca, certfile=s.tls_cert, keyfile=s.tls_key)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.reconnect_delay_set(0.1, 5)
        return client

    def _connect_async(self) -> None:
        if self.protocol == mqtt.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY
            props.ReceiveMaximum = self.settings.receive_maximum
            self.client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive,
                                      clean_start=False, properties=props)
        else:
            self.client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive)

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: float = 10.0) -> None:
        """Connect (persistent session), subscribe, start the worker thread; wait until subscribed."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="haarvest-ingest-flush", daemon=True)
        self._thread.start()
        self._connect_async()
        self.client.loop_start()
        if self.settings.protocol == "auto" and wait:
            started = time.monotonic()
            deadline = started + wait
            while not self._subscribed.wait(0.05) and time.monotonic() < deadline:
                if self.protocol != mqtt.MQTTv5:
                    continue
                silent = (not self._connacked and self.client.socket() is not None
                          and time.monotonic() - started > CONNACK_TIMEOUT)
                if self._version_failures >= 2 or silent:
                    self._fall_back()
        if wait and not self._subscribed.wait(wait):
            raise TimeoutError(f"could not subscribe on {self.settings.host}:{self.settings.port} in {wait}s")

    def _fall_back(self) -> None:
        """Switch to MQTT 3.1.1 for good (the broker does not speak MQTT 5)."""
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

    def stop(self, drain: bool = True) -> None:
        """Stop: with ``drain``, commit and acknowledge what was received first; then disconnect."""
        self._stop.set()
        if self._thread is not None:
            if not drain:
                self._generation += 1  # nothing in flight gets acknowledged: the broker redelivers it
            self._thread.join(30)
            self._thread = None
        self.client.disconnect()
        self.client.loop_stop()
        self.metrics.connected = False

    def abort(self) -> None:
        """Drop the connection without acknowledging anything in flight (tests: simulate a crash)."""
        self._generation += 1
        self._stop.set()
        try:
            sock = self.client.socket()
            if sock is not None:
                sock.close()
        finally:
            self.client.loop_stop()
            if self._thread is not None:
                self._thread.join(30)
                self._thread = None

    def publish(self, topic: str, payload: bytes, retain: bool = False, qos: int = 1, timeout: float = 10.0) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(timeout)

    # ------------------------------------------------------------------ paho callbacks (network thread)
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:  # noqa: ANN001
        if reason_code.is_failure:
            if reason_code.value in _UNSUPPORTED_VERSION:
                self._version_failures += 1
            log.warning("MQTT connect refused: %s", reason_code)
            return
        self._connacked = True
        with self._batch_lock:  # a batch being acknowledged finishes on the old connection's generation first
            self._generation += 1
        self.metrics.connected = True
        if self.protocol == mqtt.MQTTv5:
            client.subscribe(self.topic, options=SubscribeOptions(qos=1))
        else:
            client.subscribe(self.topic, qos=1)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # noqa: ANN001
        if all(not rc.is_failure for rc in reason_codes):
            self._subscribed.set()
        else:
            log.error("subscription to %s refused: %s", self.topic, reason_codes)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:  # noqa: ANN001
        if not self._connacked:
            self._version_failures += 1  # closed before any CONNACK: e.g. a 3.1.1-only broker seeing MQTT 5
        self.metrics.connected = False

    def _on_message(self, client, userdata, msg) -> None:  # noqa: ANN001
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = ""
        item = _Msg(topic, msg.payload, msg.mid, msg.qos, self._generation)
        with self._batch_lock:
            now = time.monotonic()
            if not self._pending:
                self._pending_since = now
            self._pending.append(item)
            if len(self._pending) >= self.settings.batch_size or now - self._pending_since >= self._batch_s:
                self._flush_locked()

    # ------------------------------------------------------------------ flusher thread
    def _run(self) -> None:
        """Process a pending batch that no further message came to flush: once its first message is twice
        ``batch_ms`` old (under load the network thread flushes at ``batch_ms``, see :meth:`_on_message`, so the
        work stays in one thread); on stop, process what is left."""
        while True:
            stopping = self._stop.wait(self._batch_s / 2)
            with self._batch_lock:
                if self._pending and (stopping or time.monotonic() - self._pending_since >= 2 * self._batch_s):
                    self._flush_locked()
            if stopping:
                return

    def _flush_locked(self) -> None:
        batch, self._pending = self._pending, []
        self._process(batch)

    def _process(self, batch: list[_Msg]) -> None:
        """Validate, commit and acknowledge ``batch`` — retried until it commits (or the worker stops).

        A batch is never dropped: MQTT redelivers an unacknowledged message only when the session reconnects, so a
        dropped batch would stay unacknowledged in the broker's in-flight window (which then fills: delivery stops)
        while later reports of the same devices commit and raise their high-water marks past it — the redelivered
        copies would be rejected as replays. So while the store fails (a full disk, a PostgreSQL outage), the
        batch is retried with back-off under the batch lock: nothing later is processed or acknowledged, the
        broker holds the rest, ``/healthz`` says ``stalled``. Each retry starts from the store's state
        (:meth:`Validator.reload`). On :meth:`stop` a failing batch is abandoned unacknowledged: the persistent
        session redelivers it to the next run."""
        delay = RETRY_FIRST_S
        while True:
            try:
                self._process_once(batch)
                return
            except Exception:  # noqa: BLE001 - logged; the batch is retried, never lost
                log.exception("ingest of a batch of %d messages failed; nothing of it is acknowledged, retrying",
                              len(batch))
                self.metrics.record_failure()
            while True:  # the next attempt starts from the store's state: the failed one's reservations are void
                if self._stop.wait(delay):
                    log.warning("stopping with a batch of %d uncommitted messages: not acknowledged, the broker "
                                "redelivers them", len(batch))
                    return
                delay = min(2 * delay, RETRY_MAX_S)
                try:
                    self.validator.reload()
                    break
                except Exception:  # noqa: BLE001 - the store is still down
                    log.warning("validator reload failed (store unavailable?); retrying in %.1f s", delay)
                    self.metrics.record_failure()

    def _process_once(self, batch: list[_Msg]) -> None:
        t0 = time.perf_counter()
        accepted: list[StoredReport] = []
        rejected: Counter[str] = Counter()
        duplicates = 0
        results = self.validator.check_batch([(msg.topic, msg.payload) for msg in batch])
        for result in results:
            if not isinstance(result, wire.WireError):
                accepted.append(result)
            elif result.reason == DUPLICATE:
                duplicates += 1
            else:
                rejected[result.reason] += 1
        counters = dict(rejected)
        if duplicates:
            counters[DUPLICATE] = duplicates
        inserted = self.store.commit_batch(accepted, counters)
        self.validator.batch_committed()
        generation = self._generation
        for msg in batch:
            if msg.qos > 0 and msg.generation == generation:
                self.client.ack(msg.mid, msg.qos)
        self.metrics.record_batch(len(batch), inserted, duplicates + (len(accepted) - inserted), rejected,
                                  time.perf_counter() - t0)
