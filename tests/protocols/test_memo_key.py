"""The keys a device derives from its secret (protocols/memo_key.py): the documented HMACs, pinned values (persisted
memo tables and ledgers hold them: they must never change), and the ones the edge agent uses."""

import hashlib
import hmac

import pytest

from protocols import wire
from protocols.longitudinal.memo import encode_value
from protocols.memo_key import canonical_value, device_seed, prr_seed, slot_key
from protocols.memo_key import record_key as record_memo_key

SECRET = bytes(range(32))


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
    """One home: the agent's pipeline computes its memo keys with protocols.memo_key.record_key."""
    import edge_agent.pipeline as agent

    assert agent.record_key is record_memo_key


def test_every_key_construction_is_pinned():
    """The values of each construction, as stored by devices before the constructions moved here: a change would
    orphan every persisted memo (and re-draw LOLOHA's hash seed, a new PRR for every slot)."""
    canon = [["g", 3, 17], ["x", 42.5]]
    assert record_memo_key(SECRET, "cpu", '{"mechanism":"haar"}', canon) == (
        "29ff1a4d62446d90c95bf3841504d8f58da8ea618fd1a3df74675e70fdc8be1a")
    assert slot_key(SECRET, "app", encode_value(3)) == (
        "09d7694fd75eada6c6627d37e58a881600ad33bb177c61f0a45cf741a81e0226")
    assert prr_seed(SECRET, "app", encode_value(3)) == (
        43338765328597557486075035797115693882514529709727630922771907944687193612246)
    assert device_seed(SECRET, "app") == 2406594289313952162
    digest = hmac.new(SECRET, b"haarvest-loloha-seed\n" + b"app", hashlib.sha256).digest()
    assert device_seed(SECRET, "app") == int.from_bytes(digest[:8], "big") >> 2 < 2**62


def test_the_edge_agent_derives_loloha_seeds_with_device_seed():
    import edge_agent.pipeline as agent

    assert agent.device_seed is device_seed
