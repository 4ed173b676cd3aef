"""The record memo key (protocols/memo_key.py): the documented HMAC, and the one the edge agent uses."""

import hashlib
import hmac

import pytest

from protocols import wire
from protocols.memo_key import canonical_value
from protocols.memo_key import memo_key as record_memo_key


def test_record_memo_key_is_the_documented_hmac():
    secret = bytes(range(32))
    canon = [canonical_value(exponent=3, grid_index=17), canonical_value(42.5), canonical_value(-0.0)]
    assert canon == [["g", 3, 17], ["x", 42.5], ["x", 0.0]]
    key = record_memo_key(secret, "cpu", '{"mechanism":"haar"}', canon)
    msg = b"haarvest-memo-v1\n" + wire.canonical_json(["cpu", '{"mechanism":"haar"}', canon])
    assert key == hmac.new(secret, msg, hashlib.sha256).hexdigest()
    assert key != record_memo_key(secret, "cpu", '{"mechanism":"haar"}', [["g", 3, 18], *canon[1:]])
    with pytest.raises(ValueError, match="32 bytes"):
        record_memo_key(b"short", "cpu", "", canon)
    with pytest.raises(ValueError, match="exponent"):
        canonical_value(grid_index=3)


def test_the_edge_agent_uses_the_one_memo_key():
    """One home: the agent's pipeline computes its memo keys with protocols.memo_key.memo_key."""
    import edge_agent.pipeline as agent

    assert agent.memo_key is record_memo_key
