"""Memo keys: the one construction of the edge agent and the simulations (SPEC §2, step 4; docs/spec.md).

A memoized report is stored under ``HMAC-SHA256(secret, "haarvest-memo-v1\\n" ‖ canonical_json([stream, spec,
canonical values]))`` (hex), where ``spec`` is the canonical JSON of the mechanism name and parameters (changing ε
or the mechanism starts a new memo) and each dimension's canonical value is :func:`canonical_value` — its grid
index and step exponent when α-rounded, else the clipped value. The secret never leaves the device, so the key
reveals nothing about the value to anyone without it.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import numpy as np

from protocols import wire

__all__ = ["MEMO_KEY_PREFIX", "canonical_value", "canonical_codes", "memo_key"]

#: Domain-separation prefix of memo keys.
MEMO_KEY_PREFIX = b"haarvest-memo-v1\n"


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


def memo_key(secret: bytes, stream: str, spec: str, canonical_values: list[Any]) -> str:
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
    return hmac.new(bytes(secret), msg, hashlib.sha256).hexdigest()
