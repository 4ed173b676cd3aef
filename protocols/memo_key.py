"""Memo keys and the other values a device derives from its secret (SPEC §2, step 4; docs/spec.md): one home.

Each construction has its own HMAC-SHA256 domain prefix, so no two of them can coincide. The constructions are
frozen — persisted memo tables and ledgers hold their outputs — and tests/protocols/test_memo_key.py pins one value
of each:

* :func:`record_key` — a memoized record report (the edge agent's numeric, vector, frequency and distribution
  streams; the fleet simulator): ``HMAC(secret, "haarvest-memo-v1\\n" ‖ canonical_json([stream, spec, canonical
  values]))`` (hex), where ``spec`` is the canonical JSON of the mechanism name and parameters (changing ε or the
  mechanism starts a new memo) and each dimension's canonical value is :func:`canonical_value` — its grid index
  and step exponent when α-rounded, else the clipped value;
* :func:`slot_key` — a longitudinal protocol's memo slot (:mod:`protocols.longitudinal`): ``HMAC(secret,
  "haarvest/memo-key/v1\\0" ‖ stream ‖ 0x00 ‖ slot bytes)`` (hex), the slot encoded by
  :func:`protocols.longitudinal.memo.encode_value`;
* :func:`prr_seed` — the seed of a slot's stateless permanent randomized response: the same message under the
  domain ``"haarvest/prr-seed/v1\\0"`` (so a leaked memo key does not reveal the PRR seed);
* :func:`device_seed` — a per-stream parameter fixed for the device's life (LOLOHA's hash seed):
  ``HMAC(secret, "haarvest-loloha-seed\\n" ‖ stream)``, its first 8 bytes big-endian shifted right by 2 (< 2^62).

The secret never leaves the device, so a key reveals nothing about the value to anyone without it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import numpy as np

from protocols import wire

__all__ = ["MEMO_KEY_PREFIX", "SLOT_KEY_DOMAIN", "PRR_SEED_DOMAIN", "DEVICE_SEED_PREFIX", "canonical_value",
           "canonical_codes", "record_key", "check_secret", "slot_key", "prr_seed", "device_seed"]

#: Domain-separation prefix of record memo keys (:func:`record_key`).
MEMO_KEY_PREFIX = b"haarvest-memo-v1\n"
#: Domain of longitudinal memo-slot keys (:func:`slot_key`).
SLOT_KEY_DOMAIN = b"haarvest/memo-key/v1\x00"
#: Domain of stateless PRR seeds (:func:`prr_seed`).
PRR_SEED_DOMAIN = b"haarvest/prr-seed/v1\x00"
#: Domain-separation prefix of per-stream device seeds (:func:`device_seed`).
DEVICE_SEED_PREFIX = b"haarvest-loloha-seed\n"


def canonical_value(value: float | None = None, *, exponent: int | None = None, grid_index: int | None = None) -> list[Any]:
    """A dimension's canonical memo-key form: ``["g", m, i]`` when rounded (step exponent m, grid index i),
    else ``["x", value]`` (the clipped raw value, ``-0.0`` as ``0.0``: one value, one key) — the one constructor of
    the forms the edge agent (:mod:`edge_agent.rounding_state`, :mod:`edge_agent.pipeline`) and the fleet simulator
    key on."""
    if grid_index is not None:
        if exponent is None:
            raise ValueError("a rounded value needs its step exponent")
        return ["g", int(exponent), int(grid_index)]
    if value is None:
        raise ValueError("give a value, or an exponent and a grid index")
    v = float(value)
    if not np.isfinite(v):
        raise ValueError("memo-key values must be finite")
    return ["x", v + 0.0]  # -0.0 → 0.0


def canonical_codes(
    values: Any, rounded: Any, exponents: Any, grid_index: Any
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`canonical_value` for arrays, as two int64 arrays ``(kind, code)`` of the shape of ``values``: ``(m + 1,
    i)`` for ``["g", m, i]`` (where ``rounded``) and ``(0, the bits of v + 0.0)`` for ``["x", v]`` — one-to-one, so
    two records have equal canonical values iff their code rows are equal. For simulations that find repeated
    keys by hashing these rows instead of HMACing (:mod:`simulations.fleet_pipeline`)."""
    v = np.asarray(values, dtype=float)
    r = np.asarray(rounded, dtype=bool)
    kind = np.where(r, np.asarray(exponents, dtype=np.int64) + 1, 0).astype(np.int64)
    code = np.where(r, np.asarray(grid_index, dtype=np.int64), (v + 0.0).view(np.int64))
    return kind, code.astype(np.int64)


def record_key(secret: bytes, stream: str, spec: str, canonical_values: list[Any]) -> str:
    """``HMAC-SHA256(secret, prefix ‖ canonical_json([stream, spec, canonical_values]))`` in hex.

    ``canonical_values`` lists one :func:`canonical_value` per dimension of the record (grid indices and step
    exponents of rounded dimensions). The cache never sees raw values, only this key. The edge agent calls this
    function; the fleet simulator (:mod:`simulations.fleet_pipeline`) finds repeated keys from the same canonical
    values (:func:`canonical_codes`), and tests/simulations/test_fleet_pipeline_equivalence.py checks that the keys of its
    canonical values are the device's.
    """
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 32:
        raise ValueError("the memo secret must be at least 32 bytes")
    if not isinstance(stream, str) or not isinstance(spec, str):
        raise ValueError("stream and spec must be strings")
    msg = MEMO_KEY_PREFIX + wire.canonical_json([stream, spec, canonical_values])
    return hmac.digest(bytes(secret), msg, "sha256").hex()  # the one-shot C path: hmac.new(...).hexdigest()


def check_secret(secret: Any) -> bytes:
    """Validate a device secret of the longitudinal protocols: bytes (or hex string) of at least 16 bytes."""
    if isinstance(secret, str):
        try:
            secret = bytes.fromhex(secret)
        except ValueError:
            raise ValueError("secret given as str must be hexadecimal") from None
    if not isinstance(secret, (bytes, bytearray)):
        raise ValueError(f"secret must be bytes, got {type(secret).__name__}")
    if len(secret) < 16:
        raise ValueError(f"secret must be at least 16 bytes, got {len(secret)}")
    return bytes(secret)


def _slot_hmac(secret: bytes, domain: bytes, stream: str, value_bytes: bytes) -> bytes:
    if not isinstance(stream, str) or "\x00" in stream:
        raise ValueError("stream must be a str without NUL characters")
    msg = domain + stream.encode("utf-8") + b"\x00" + bytes(value_bytes)
    return hmac.new(check_secret(secret), msg, hashlib.sha256).digest()


def slot_key(secret: bytes, stream: str, value_bytes: bytes) -> str:
    """Hex ``HMAC-SHA256(secret, SLOT_KEY_DOMAIN ‖ stream ‖ 0x00 ‖ value_bytes)``: the memo table key of a
    longitudinal protocol's slot."""
    return _slot_hmac(secret, SLOT_KEY_DOMAIN, stream, value_bytes).hex()


def prr_seed(secret: bytes, stream: str, value_bytes: bytes) -> int:
    """256-bit integer ``HMAC-SHA256(secret, PRR_SEED_DOMAIN ‖ stream ‖ 0x00 ‖ value_bytes)`` (stateless PRR)."""
    return int.from_bytes(_slot_hmac(secret, PRR_SEED_DOMAIN, stream, value_bytes), "big")


def device_seed(secret: bytes, stream: str) -> int:
    """A per-stream seed in [0, 2^62) fixed for the device's life (LOLOHA's hash seed):
    ``HMAC-SHA256(secret, DEVICE_SEED_PREFIX ‖ stream)``, first 8 bytes big-endian, shifted right by 2."""
    digest = hmac.new(bytes(secret), DEVICE_SEED_PREFIX + stream.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> 2
