"""Flood quarantine: a device that sends too much, or too much that is rejected, is cut off automatically.

Two parts:

* :class:`FloodGuard` counts, per enrolled device and fixed window of ``window_s`` seconds, the messages that reach
  ingest and the rejections charged to it (:func:`coordinator.validate.per_device_counters`; duplicates and
  ``round_closed`` — what an honest device returning from a long time offline produces — are not counted). A device
  over ``max_messages`` or ``max_rejections`` in one window is reported once; the ingest then marks it
  ``quarantined`` in the store (:meth:`coordinator.store.Store.set_device_status`, counter
  ``quarantined.<device>``), and the validator rejects its reports as ``quarantined`` before any signature check.
* :class:`BrokerQuarantine` keeps the broker in step with the store: every quarantined device becomes a client of
  mosquitto's dynamic-security plugin in the role ``quarantined``, which denies it every publish and subscription,
  and is disconnected (``disableClient``); a released device (``coordinator devices --release ID``) is deleted from
  the plugin again, so the shipped ACL file applies to it as before. The commands go to
  ``$CONTROL/dynamic-security/v1`` over the ingest's own connection (its certificate, CN ``coordinator``, holds the
  plugin's admin role in ``deploy/mosquitto/dynamic-security.json``). A broker without the plugin ignores them: the
  device is then still rejected by the coordinator, at the cost of receiving its messages.

Honest traffic is far below the defaults: an agent sends one report per stream and round, plus re-sends of what the
coordinator has not receipted after ``mqtt.receipt_timeout_s`` (30 s, doubling).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.store import Store, StoredReport
from protocols import wire

__all__ = ["FloodGuard", "BrokerQuarantine", "DYNSEC_TOPIC", "QUARANTINE_ROLE"]

log = logging.getLogger(__name__)

DYNSEC_TOPIC = "$CONTROL/dynamic-security/v1"
QUARANTINE_ROLE = "quarantined"
#: rejections an honest device produces (a redelivered copy; a report that arrives after its round closed)
NOT_COUNTED = ("duplicate", "round_closed")


class FloodGuard:
    """Per-device message and rejection counts over fixed windows; :meth:`observe` returns the devices that just
    went over a limit (each once, until :meth:`forget`). A limit of 0 disables that check."""

    def __init__(self, max_messages: int = 2000, max_rejections: int = 500, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_messages < 0 or max_rejections < 0 or window_s <= 0:
            raise ValueError("flood limits must be >= 0 and the window > 0")
        self.max_messages, self.max_rejections, self.window_s = int(max_messages), int(max_rejections), float(window_s)
        self._clock = clock
        self._window_start = clock()
        self._messages: Counter[str] = Counter()
        self._rejections: Counter[str] = Counter()
        self._flagged: set[str] = set()

    def observe(self, results: Sequence[StoredReport | wire.WireError]) -> list[tuple[str, str]]:
        """Count one validated batch; ``[(device_id, why)]`` for devices over a limit now."""
        now = self._clock()
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._messages.clear()
            self._rejections.clear()
        out: list[tuple[str, str]] = []
        for r in results:
            device = r.device_id
            if not device or device in self._flagged:
                continue
            self._messages[device] += 1
            if isinstance(r, wire.WireError) and r.reason not in NOT_COUNTED:
                self._rejections[device] += 1
            if self.max_messages and self._messages[device] > self.max_messages:
                why = f"more than {self.max_messages} messages in {self.window_s:g} s"
            elif self.max_rejections and self._rejections[device] > self.max_rejections:
                why = f"more than {self.max_rejections} rejected messages in {self.window_s:g} s"
            else:
                continue
            self._flagged.add(device)
            out.append((device, why))
        return out

    def forget(self, device_id: str) -> None:
        """Count ``device_id`` again (it was released)."""
        self._flagged.discard(device_id)
        self._messages.pop(device_id, None)
        self._rejections.pop(device_id, None)


def dynsec_commands(cut: Sequence[str], release: Sequence[str]) -> bytes:
    """The dynamic-security plugin's command list that cuts off ``cut`` and releases ``release``."""
    cmds: list[dict[str, Any]] = [{"command": "createRole", "rolename": QUARANTINE_ROLE, "acls": [
        {"acltype": acltype, "topic": "#", "allow": False, "priority": 1000}
        for acltype in ("publishClientSend", "publishClientReceive", "subscribePattern")]}] if cut else []
    for device in cut:
        cmds.append({"command": "createClient", "username": device, "roles": [{"rolename": QUARANTINE_ROLE}]})
        cmds.append({"command": "addClientRole", "username": device, "rolename": QUARANTINE_ROLE})
        cmds.append({"command": "disableClient", "username": device})  # disconnects it now
    for device in release:
        cmds.append({"command": "deleteClient", "username": device})
    return json.dumps({"commands": cmds}).encode()


class BrokerQuarantine:
    """Keeps the broker's dynamic-security clients in step with the store's quarantined devices (a thread that
    syncs every ``interval`` s, and at once when :meth:`poke`\\ d).

    ``publish(topic, payload)`` sends through the ingest's connection and raises if the broker refuses."""

    def __init__(self, store: Store, publish: Callable[[str, bytes], None], interval: float = 2.0,
                 on_change: Callable[[list[str]], None] | None = None) -> None:
        self.store, self.publish, self.interval = store, publish, interval
        #: called with the released devices whenever any device's status changed (e.g. by another process)
        self.on_change = on_change
        self._cut: set[str] | None = None  # what the broker was told; None: not yet synced this run
        self._statuses: dict[str, str] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="haarvest-quarantine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(15)

    def poke(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the broker or store is away: try again next interval
                if not self._warned:
                    log.warning("could not update the broker's quarantine (dynamic-security plugin): %s", exc)
                    self._warned = True
            self._wake.wait(self.interval)
            self._wake.clear()

    def sync(self) -> tuple[list[str], list[str]]:
        """Tell the broker what changed since the last sync; returns (cut off, released)."""
        statuses = self.store.device_statuses()  # the devices that are not active: small, whatever the fleet
        quarantined = {d for d, status in statuses.items() if status == "quarantined"}
        if self._cut is None:  # first sync of this run: release whatever was ever quarantined and is not now
            ever = {d for d, c in self.store.device_counters().items() if c.get("quarantined")}
            cut, release = sorted(quarantined), sorted(ever - quarantined)
        else:
            cut, release = sorted(quarantined - self._cut), sorted(self._cut - quarantined)
        if cut or release:
            self.publish(DYNSEC_TOPIC, dynsec_commands(cut, release))
            for device in cut:
                log.warning("device %s is cut off at the broker (quarantined)", device)
            for device in release:
                log.warning("device %s is released from quarantine", device)
        if statuses != self._statuses and self.on_change is not None:
            self.on_change(release)
        self._statuses = statuses
        self._cut = quarantined
        self._warned = False
        return cut, release
