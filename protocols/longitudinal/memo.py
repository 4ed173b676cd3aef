"""Memoization for longitudinal LDP: keyed memo keys, PRR seeds derived from a device secret, memo tables.

A longitudinal protocol randomizes a value twice (Erlingsson et al., "RAPPOR", CCS 2014, §3):

* the **permanent randomized response** (PRR) ``z = PRR(v)`` is drawn once per memo slot (value, hashed value,
  grid point, ...) and reused for ever, so an unchanged value costs ε∞ once, however often it is reported;
* the **instantaneous randomized response** (IRR) ``y = IRR(z)`` is fresh at every report, so that one report
  alone is only ε1-LDP (ε1 < ε∞) and reports cannot be linked by equality.

Two memoization styles are supported:

``"stateless"``  the PRR for a slot is a deterministic function of the slot: its randomness comes from a
                 numpy Generator seeded with ``HMAC-SHA256(secret, "prr" ‖ stream ‖ slot)`` (RAPPOR's pattern —
                 memoization without storing the PRR). The device still records which memo keys it has already
                 been charged for (keys are HMACs, never raw values).
``"table"``      the PRR is drawn from the device's OS-entropy generator the first time and stored in a table
                 keyed by ``slot_key(secret, stream, slot)`` (raw values are never stored, only HMACs).

Memo keys and PRR seeds use distinct HMAC domains, so a memo key that leaks (e.g. in a ledger entry) does not
reveal the PRR seed. Both are derived in :mod:`protocols.memo_key` (:func:`~protocols.memo_key.slot_key`,
:func:`~protocols.memo_key.prr_seed`), the home of every key a device derives from its secret.
"""

from __future__ import annotations

import math
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from protocols.memo_key import prr_seed

__all__ = [
    "MemoStyle",
    "MEMO_STYLES",
    "LongitudinalReport",
    "MemoTable",
    "encode_value",
    "prr_generator",
    "new_secret",
]

MemoStyle = Literal["stateless", "table"]
MEMO_STYLES: tuple[str, ...] = ("stateless", "table")


def new_secret() -> bytes:
    """A fresh 256-bit device secret from the OS CSPRNG."""
    return secrets.token_bytes(32)


def encode_value(value: Any) -> bytes:
    """Canonical, type-tagged bytes of a memo slot (so 1, "1" and b"1" never collide).

    Supported: integers (Python or numpy), str, bytes, finite floats, and tuples of these.
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError("booleans are not valid memo values; use 0/1")
    if isinstance(value, (int, np.integer)):
        return b"i:" + str(int(value)).encode()
    if isinstance(value, str):
        return b"s:" + value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return b"b:" + bytes(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"memo values must be finite, got {value!r}")
        return b"f:" + float(value).hex().encode()
    if isinstance(value, tuple):
        parts = [encode_value(v) for v in value]
        return b"t:" + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    raise ValueError(f"cannot encode memo value of type {type(value).__name__}")


def prr_generator(secret: bytes, stream: str, value_bytes: bytes) -> np.random.Generator:
    """The generator whose first draws define the slot's permanent randomized response (same slot ⇒ same PRR)."""
    return np.random.default_rng(prr_seed(secret, stream, value_bytes))


@dataclass(frozen=True)
class LongitudinalReport:
    """One report of a longitudinal client, with the privacy charge the device ledger must record first.

    Attributes:
        report: what leaves the device (protocol-specific: an int, a tuple, or a numpy array of bits).
        charge: ε spent by this report — ε∞ when a new PRR memo entry was created, 0 when memoized.
        memo_key: hex HMAC of the memo slot (None for protocols without memoization, e.g. DDRM).
        is_new: whether this report created a memo entry (equivalently: whether ``charge > 0``).
    """

    report: Any
    charge: float
    memo_key: str | None
    is_new: bool


class MemoTable:
    """Memo entries keyed by hex HMAC memo keys. Entries are JSON-able (None in the stateless style)."""

    def __init__(self, entries: dict[str, Any] | None = None) -> None:
        self._entries: dict[str, Any] = {}
        for key, entry in (entries or {}).items():
            self.put(key, entry)

    @staticmethod
    def _check_key(key: Any) -> str:
        if not isinstance(key, str) or len(key) != 64:
            raise ValueError("memo keys are 64-character hex HMAC-SHA256 digests")
        try:
            bytes.fromhex(key)
        except ValueError:
            raise ValueError("memo keys are 64-character hex HMAC-SHA256 digests") from None
        return key

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, key: str) -> Any:
        return self._entries[key]

    def put(self, key: str, entry: Any) -> None:
        self._entries[self._check_key(key)] = entry

    def to_state(self) -> dict[str, Any]:
        return dict(self._entries)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MemoTable:
        if not isinstance(state, dict):
            raise ValueError("memo table state must be a dict of key -> entry")
        return cls(state)
