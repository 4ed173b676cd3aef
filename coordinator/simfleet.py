"""A simulated fleet of signing devices, for tests, benchmarks and demos (not used by the coordinator itself).

Each simulated device has a report key (Ed25519 by default, or HMAC-SHA256), a boot counter and a strictly increasing sequence number, and emits
``(topic, payload)`` pairs exactly as a real device would (:mod:`protocols.wire`, body convention of
:mod:`protocols.contract`). Privatization is left to the caller (``mechanism.privatize`` over the whole fleet
at once, vectorised), so this module only signs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocols.contract import make_body
from protocols import catalogue, wire

__all__ = ["SimDevice", "SimFleet"]


@dataclass
class SimDevice:
    device_id: str
    key: wire.DeviceKey
    boot: int = 1
    seq: int = 0
    history: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def public_key(self) -> str:
        """The registry entry (:func:`protocols.wire.registry_key`)."""
        return wire.registry_key(self.key)

    @property
    def topic(self) -> str:
        return wire.report_topic(self.device_id)

    def report(self, round_id: str, stream: str, mechanism: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """Sign the next report (seq increases by one) and return (topic, payload)."""
        self.seq += 1
        rep = wire.Report(device_id=self.device_id, boot=self.boot, seq=self.seq, round_id=round_id,
                          stream=stream, mechanism=mechanism, body=body)
        out = (self.topic, wire.signed_report_bytes(rep, self.topic, self.key))
        return out


class SimFleet:
    """``n`` devices named ``<prefix>-00000`` …, with ``signature`` report keys (``ed25519`` or ``hmac-sha256``)."""

    def __init__(self, n: int, prefix: str = "dev", signature: str = "ed25519") -> None:
        if n < 1:
            raise ValueError("a fleet needs at least one device")
        self.devices = [SimDevice(f"{prefix}-{i:05d}", wire.generate_device_key(signature)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.devices)

    def enrollment(self) -> list[dict[str, str]]:
        """What ``haarvest agent enroll`` prints, for every device."""
        return [{"device_id": d.device_id, "public_key": d.public_key} for d in self.devices]

    def reports(self, round_id: str, stream: str, mechanism: str, rows: Any, mech: Any) -> list[tuple[str, bytes]]:
        """One signed report per device; ``rows[i]`` is device i's privatized row of the built mechanism ``mech``
        (``catalogue.build(mechanism, …)``), sent as a device sends it: ``make_body(entry.encode_row(mech, row))``."""
        if len(rows) != len(self.devices):
            raise ValueError(f"need one row per device ({len(self.devices)}), got {len(rows)}")
        codec = catalogue.entry(mechanism)
        return [d.report(round_id, stream, mechanism, make_body(codec.encode_row(mech, r)))
                for d, r in zip(self.devices, rows)]
