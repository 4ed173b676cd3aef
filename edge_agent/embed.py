"""Helpers for embedding agents in-process (the demo, benchmarks, tests): configs and identities in code.

    secrets = new_identity()                       # Ed25519 key + HMAC secret, in memory
    cfg = simple_config("dev-0001", state_dir, dimensions=[numeric("cpu", 0, 100)], mqtt={"port": 1883},
                        coordinator_public_key=coord_pub)
    agent = Agent(cfg, source=IterableSource(rows), secrets=secrets)

``enrolment(cfg, secrets)`` is the JSON the coordinator's device registry needs.
"""

from __future__ import annotations

import secrets as _secrets
from pathlib import Path
from typing import Any

from protocols import wire

from .config import AgentConfig, Secrets, parse_config

__all__ = ["new_identity", "numeric", "categorical", "simple_config", "enrolment"]


def new_identity(signature: str = "ed25519") -> Secrets:
    """A fresh device identity held in memory (``haarvest agent enroll`` writes the same to files); ``signature``
    is the report-key algorithm (``ed25519`` or ``hmac-sha256``, :mod:`protocols.wire`)."""
    return Secrets(signing_key=wire.generate_device_key(signature), hmac_secret=_secrets.token_bytes(32))


def numeric(name: str, lo: float, hi: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "numeric", "lo": lo, "hi": hi, **extra}


def categorical(name: str, k: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "categorical", "k": k, **extra}


def simple_config(
    device_id: str,
    state_dir: str | Path,
    dimensions: list[dict[str, Any]],
    streams: list[dict[str, Any]] | None = None,
    *,
    epsilon: float = 1.0,
    total_cap: float = 1000.0,
    mqtt: dict[str, Any] | None = None,
    coordinator_public_key: str | None = None,
    **top: Any,
) -> AgentConfig:
    """An :class:`AgentConfig` from plain values (validated exactly like a TOML file)."""
    data: dict[str, Any] = {
        "device_id": device_id,
        "state_dir": str(state_dir),
        "dimensions": dimensions,
        "ledger": {"total_cap": total_cap},
        "privacy": {"epsilon": epsilon, **top.pop("privacy", {})},
        "sample_interval_s": top.pop("sample_interval_s", None) or 3600.0,
        **top,
    }
    if streams is not None:
        data["streams"] = streams
    if mqtt is not None:
        data["mqtt"] = mqtt
    if coordinator_public_key is not None:
        data["coordinator_public_key"] = coordinator_public_key
    data.setdefault("schedule", "rounds" if coordinator_public_key else "interval")
    return parse_config(data, origin=f"config for {device_id}")


def enrolment(cfg: AgentConfig, secrets: Secrets) -> dict[str, Any]:
    """The registry entry for this device: id, registry key (Ed25519 public key, or the HMAC report key),
    algorithm, and its contract — the streams it is configured for (name → mechanism, ``auto`` = whichever the round
    names); the coordinator rejects any other stream from it (``off_contract``)."""
    return {"device_id": cfg.device_id, "public_key": secrets.public_key_b64, "algorithm": secrets.algorithm,
            "streams": {st.name: st.mechanism for st in cfg.effective_streams()}}
