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

__all__ = ["MEMO_KEY_PREFIX", "canonical_value", "memo_key"]

#: Domain-separation prefix of memo keys.
MEMO_KEY_PREFIX = b"haarvest-memo-v1\n"


def canonical_value(value: float | None = None, *, exponent: int | None = None, grid_index: int | None = None) -> list[Any]:
    """A dimension's canonical memo-key form: ``["g", m, i]`` when rounded (step exponent m, grid index i),
    else ``["x", value]`` (the clipped raw value) — the forms the edge agent's rounding state produces (:mod:`edge_agent.rounding_state`)."""
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


def memo_key(secret: bytes, stream: str, spec: str, canonical_values: list[Any]) -> str:
    """``HMAC-SHA256(secret, prefix ‖ canonical_json([stream, spec, canonical_values]))`` in hex.

    ``canonical_values`` lists one :func:`canonical_value` per dimension of the record (grid indices and step
    exponents of rounded dimensions). The cache never sees raw values, only this key. The edge agent and the
    fleet simulations (:mod:`protocols.pipeline.fleet`) both call this function, so their keys agree.
    """
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 32:
        raise ValueError("the memo secret must be at least 32 bytes")
    if not isinstance(stream, str) or not isinstance(spec, str):
        raise ValueError("stream and spec must be strings")
    msg = MEMO_KEY_PREFIX + wire.canonical_json([stream, spec, canonical_values])
    return hmac.new(bytes(secret), msg, hashlib.sha256).hexdigest()
