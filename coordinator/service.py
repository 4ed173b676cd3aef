"""The embeddable coordinator: store + validator + MQTT ingest + rounds + HTTP API behind start()/stop().

Example (in-process, e.g. a demo or a test)::

    coord = Coordinator(CoordinatorConfig(db="run/coord.db", mqtt_port=1883, http_port=8080, key_file="run/coord.key"))
    coord.start()
    coord.enroll("dev-1", public_key_b64)
    coord.open_round("r1", epsilon=1.0, params={"streams": {...}})
    ...
    print(coord.estimate("r1"))
    coord.stop()
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator import defaults
from coordinator.estimate import StreamEstimate, VarianceBasis, estimate_round
from coordinator.ingest import IngestSettings, IngestWorker
from coordinator.metrics import Metrics
from coordinator.quarantine import BrokerQuarantine, FloodGuard
from coordinator.rounds import RoundManager
from protocols.contract import RoundParams
from coordinator.store import Store, open_store
from coordinator.validate import AUTHENTIC_REJECTIONS, Validator
from protocols import wire

__all__ = ["CoordinatorConfig", "Coordinator", "DeviceRecord", "device_rows", "load_or_create_key", "parse_contract",
           "read_device_records"]

log = logging.getLogger(__name__)


@dataclass
class CoordinatorConfig:
    db: str = defaults.DB
    key_file: str | None = None
    mqtt: bool = True
    mqtt_host: str = defaults.MQTT_HOST
    mqtt_port: int = defaults.MQTT_PORT
    client_id: str = defaults.CLIENT_ID
    shared_group: str | None = None
    batch_size: int = defaults.BATCH_SIZE
    batch_ms: float = defaults.BATCH_MS
    replay_window: int | None = None
    http_host: str = defaults.HTTP_HOST
    http_port: int | None = None
    devices_file: str | None = None
    mqtt_username: str | None = None
    mqtt_password: str | None = None
    mqtt_tls_ca: str | None = None  # CA file: connect with TLS
    mqtt_protocol: str = defaults.MQTT_PROTOCOL  # "5", "3.1.1" (e.g. amqtt) or "auto"
    mqtt_tls_cert: str | None = None  # client certificate presented to the broker (CN "coordinator"); with the key
    mqtt_tls_key: str | None = None
    mqtt_tls: bool = False  # TLS with the system's CAs when no mqtt_tls_ca is given
    #: API bearer tokens, one per line (default: ``<db>.api-token`` beside a SQLite database, created with a random
    #: token; an ephemeral token for ``:memory:`` and PostgreSQL) — see :mod:`coordinator.api`
    api_tokens_file: str | None = None
    #: flood quarantine (coordinator.quarantine): per device and window, at most this many messages / rejections
    #: (0: no limit); a device over one is quarantined and, with ``broker_quarantine``, cut off at the broker
    flood_max_messages: int = defaults.FLOOD_MAX_MESSAGES
    flood_max_rejections: int = defaults.FLOOD_MAX_REJECTIONS
    flood_window_s: float = defaults.FLOOD_WINDOW_S
    broker_quarantine: bool = defaults.BROKER_QUARANTINE


def load_or_create_key(path: str | Path | None) -> Ed25519PrivateKey:
    """The coordinator's Ed25519 key from ``path`` (base64 raw); created there (mode 0600) if missing.

    The key is written in full to a temporary file first and then hard-linked to ``path``, which fails if ``path``
    exists: of several processes starting at once (ingest workers on one host), one creates the key and the others
    read it whole — before, the others failed with ``FileExistsError`` or read the file before it was written.
    ``None`` gives an ephemeral key (tests)."""
    if path is None:
        return wire.generate_signing_key()
    p = Path(path)
    if p.exists():
        return wire.load_private_key(p.read_text())
    key = wire.generate_signing_key()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(wire.private_key_b64(key) + "\n")
        os.link(tmp, p)
    except FileExistsError:  # another process created it first: use theirs
        return wire.load_private_key(p.read_text())
    finally:
        tmp.unlink(missing_ok=True)
    return key


@dataclass(frozen=True)
class DeviceRecord:
    """One enrolment: what ``haarvest agent enroll`` prints. ``contract``: the streams the device is configured for
    (name → mechanism, ``auto`` = whichever the round names); None = any stream of a round."""

    device_id: str
    public_key: str
    contract: dict[str, str] | None = None


def parse_contract(streams: Any) -> dict[str, str] | None:
    """A contract from an enrolment's ``streams``: ``{name: mechanism}``, a list of names (any mechanism) or None."""
    if streams is None:
        return None
    if isinstance(streams, list):
        streams = {name: "auto" for name in streams}
    if not isinstance(streams, dict) or not all(
            isinstance(k, str) and re.match(wire.IDENT, k) and isinstance(v, str) for k, v in streams.items()):
        raise ValueError(f"streams must map stream names to mechanism names (or list names): {streams!r}")
    return dict(streams)


def read_device_records(source: str | Path | Any) -> list[DeviceRecord]:
    """Enrolments from JSON: one ``{"device_id", "public_key"[, "streams"]}`` object (what ``haarvest agent enroll``
    prints), a list of them, or ``{"devices": [...]}``. ``source``: path or parsed JSON. ValueError if malformed."""
    data = json.loads(Path(source).read_text()) if isinstance(source, (str, Path)) else source
    if isinstance(data, dict) and "devices" in data:
        data = data["devices"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError("device JSON must be an object, a list of objects or {'devices': [...]}")
    out = []
    for item in data:
        if not isinstance(item, dict) or "device_id" not in item or "public_key" not in item:
            raise ValueError(f"device record needs device_id and public_key: {item!r}")
        out.append(DeviceRecord(str(item["device_id"]), str(item["public_key"]), parse_contract(item.get("streams"))))
    return out


class Coordinator:
    """Everything the coordinator runs, embeddable in one process (start/stop, or a context manager)."""

    def __init__(self, config: CoordinatorConfig | None = None, *, store: Store | None = None,
                 key: Ed25519PrivateKey | None = None) -> None:
        self.config = config or CoordinatorConfig()
        self.store = store or open_store(self.config.db)
        self.key = key or load_or_create_key(self.config.key_file)
        self.metrics = Metrics()
        if self.config.devices_file:
            self.import_devices(self.config.devices_file)
        self.validator = Validator(self.store, replay_window=self.config.replay_window)
        if self.config.shared_group and self.config.replay_window == 0:  # strict mode chosen explicitly
            log.warning("shared subscription without a replay window: a report redelivered after its worker died "
                        "is rejected as a replay once another worker stored a later seq of the same device; set "
                        "replay_window (e.g. 1000)")
        self.ingest: IngestWorker | None = None
        if self.config.mqtt:
            self.ingest = IngestWorker(
                IngestSettings(host=self.config.mqtt_host, port=self.config.mqtt_port, client_id=self.config.client_id,
                               shared_group=self.config.shared_group, batch_size=self.config.batch_size,
                               batch_ms=self.config.batch_ms, username=self.config.mqtt_username,
                               password=self.config.mqtt_password, tls_ca=self.config.mqtt_tls_ca,
                               tls_cert=self.config.mqtt_tls_cert, tls_key=self.config.mqtt_tls_key,
                               tls=self.config.mqtt_tls, protocol=self.config.mqtt_protocol),
                self.store, self.validator, self.metrics,
                guard=FloodGuard(self.config.flood_max_messages, self.config.flood_max_rejections,
                                 self.config.flood_window_s),
                on_flood=self._quarantine)
        self.broker_quarantine: BrokerQuarantine | None = None
        if self.ingest is not None and self.config.broker_quarantine:
            self.broker_quarantine = BrokerQuarantine(self.store, lambda t, b: self._publish(t, b, False),
                                                      on_change=self._devices_changed)
        self.rounds = RoundManager(self.store, self.key, publish=self._publish if self.ingest else None,
                                   on_change=self.validator.set_round)
        self.api: Any = None
        self._running = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Coordinator":
        if self._running:
            return self
        if self.ingest is not None:
            self.ingest.start()
            try:
                self.rounds.republish()
            except BaseException:
                self.ingest.stop(drain=False)
                raise
            if self.broker_quarantine is not None:
                self.broker_quarantine.start()
        if self.config.http_port is not None:
            from coordinator.api import ApiServer, default_token_file, load_tokens

            token_file = self.config.api_tokens_file or default_token_file(self.config.db)
            self.api = ApiServer(self, self.config.http_host, self.config.http_port, tokens=load_tokens(token_file))
            self.api_tokens_file = None if token_file is None else str(token_file)
            self.api.start()
        self._running = True
        return self

    def stop(self) -> None:
        if self.api is not None:
            self.api.stop()
            self.api = None
        if self.broker_quarantine is not None and self._running:
            self.broker_quarantine.stop()
        if self.ingest is not None and self._running:
            self.ingest.stop()
        self._running = False

    def close(self) -> None:
        self.stop()
        self.store.close()

    def __enter__(self) -> "Coordinator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def http_url(self) -> str | None:
        return None if self.api is None else self.api.url

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard with an API token in its query (what a demo prints and a browser opens)."""
        return None if self.api is None else f"{self.api.url}/?token={self.api.token}"

    @property
    def public_key(self) -> str:
        """The coordinator's round-signing public key (base64), for provisioning devices."""
        return wire.public_key_b64(self.key)

    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        assert self.ingest is not None
        self.ingest.publish(topic, payload, retain=retain)

    # ------------------------------------------------------------------ devices
    def enroll(self, device_id: str, public_key: str, status: str = "active", *,
               streams: dict[str, str] | list[str] | None = None) -> None:
        """Register (or re-key) a device; ``streams``: its contract (see :class:`DeviceRecord`). ValueError for a
        bad id, key or contract."""
        if not re.match(wire.IDENT, device_id):
            raise ValueError(f"device id {device_id!r} is not a valid identifier")
        wire.load_registry_key(public_key)
        self.store.upsert_device(device_id, public_key.strip(), status, contract=parse_contract(streams))
        if hasattr(self, "validator"):
            self.validator.refresh_devices()

    def import_devices(self, source: str | Path | Any) -> int:
        records = read_device_records(source)
        for rec in records:
            self.enroll(rec.device_id, rec.public_key, streams=rec.contract)
        return len(records)

    def set_device_status(self, device_id: str, status: str) -> None:
        """``revoked``, ``quarantined`` or ``active`` (release); the broker follows within the guard's interval."""
        self.store.set_device_status(device_id, status)
        self.validator.refresh_devices()

    def revoke(self, device_id: str) -> None:
        self.set_device_status(device_id, "revoked")

    def _quarantine(self, flooding: list[tuple[str, str]]) -> None:
        """Quarantine the devices the flood guard reported (ingest's commit thread, after their batch committed)."""
        for device_id, why in flooding:
            self.store.set_device_status(device_id, "quarantined")
            self.store.commit_batch([], {f"quarantined.{device_id}": 1})
            log.warning("device %s quarantined: %s", device_id, why)
        self.validator.refresh_devices()
        if self.broker_quarantine is not None:
            self.broker_quarantine.poke()

    def _devices_changed(self, released: list[str]) -> None:
        """A device's status changed in the store (this or another process): re-read the registry; released
        devices are counted by the flood guard again."""
        self.validator.refresh_devices()
        if self.ingest is not None and self.ingest.guard is not None:
            for device_id in released:
                self.ingest.guard.forget(device_id)

    # ------------------------------------------------------------------ rounds and estimates
    def open_round(self, round_id: str, epsilon: float, params: RoundParams | dict[str, Any], **kw: Any) -> wire.RoundConfig:
        return self.rounds.open_round(round_id, epsilon, params, **kw)

    def close_round(self, round_id: str) -> None:
        self.rounds.close_round(round_id)

    def estimate(self, round_id: str, level: float = 0.95, variance: VarianceBasis = "plugin",
                 consistency: bool = True) -> dict[str, StreamEstimate]:
        return estimate_round(self.store, round_id, level, variance, consistency)

    def metrics_snapshot(self, store: Store | None = None) -> dict[str, Any]:
        """This process's ingest counters, the durable totals (read through ``store``, by default the
        coordinator's; the API passes its own connection) and the validator's view."""
        store = store or self.store
        snap = self.metrics.snapshot()
        snap["store"] = {k: v for k, v in store.counters().items() if "." not in k}  # per device: /api/devices
        snap["stored_reports"] = sum(store.report_counts().values())
        snap["quarantined_devices"] = sorted(d for d, status in store.device_statuses().items()
                                             if status == "quarantined")
        snap.update(self.validator.known())
        return snap


def device_rows(store: Store) -> list[dict[str, Any]]:
    """Every enrolled device with its status, contract (``streams``: None = any), stored reports, receipted
    reports (stored, or authentic and rejected for good: the device stops re-sending them), quarantines and
    rejections by reason — what ``coordinator devices`` prints and ``/api/devices`` serves. HMAC
    report keys are secrets: only their fingerprint (``key_id``) is shown."""
    records = store.device_records()
    counters = store.device_counters()
    stored = store.reports_by_device()
    rows = []
    for d, rec in sorted(records.items()):
        key = rec["public_key"]
        row: dict[str, Any] = {"device_id": d, "algorithm": "hmac-sha256" if key.startswith("hmac-sha256:") else "ed25519",
                               "key_id": wire.registry_key_id(key), "status": rec["status"]}
        if row["algorithm"] == "ed25519":
            row["public_key"] = key
        counts = counters.get(d, {})
        rejected = {k: v for k, v in sorted(counts.items()) if k != "quarantined"}
        # receipted: every stored report, and every authentic one rejected for good (it names the device's seq)
        receipted = stored.get(d, 0) + sum(v for k, v in rejected.items() if k in AUTHENTIC_REJECTIONS)
        row.update(streams=rec["contract"], stored_reports=stored.get(d, 0), receipted_reports=receipted,
                   quarantines=counts.get("quarantined", 0), rejected=rejected)
        rows.append(row)
    return rows
