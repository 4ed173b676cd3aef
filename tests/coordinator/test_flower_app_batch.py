"""The Flower coordinator validates a reply as one batch (:meth:`coordinator.validate.Validator.check_batch`) and gets
exactly the verdicts of checking its messages one by one: valid rows accepted; rows outside the mechanism's support
(validly signed by an enrolled device) rejected as ``bad_body``; tampered, replayed and duplicate messages rejected as
before — for Ed25519 and HMAC-SHA256 report keys. No Ray, no Flower transport."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from coordinator.flower_app import FlowerCoordinator, FlowerSettings
from coordinator.store import open_store
from coordinator.validate import Validator
from edge_agent.agent import Agent
from edge_agent.embed import new_identity
from edge_agent.sources import IterableSource
from protocols import wire
from simulations.flower_sim import SimFleetSpec, device_config, round_params

pytestmark = pytest.mark.integration

N = 12


def _resigned(agent: Agent, payload: bytes, **changes) -> bytes:
    """The report with ``changes``, validly signed again by the device (a buggy or malicious device)."""
    report = wire.decode_report(payload).model_copy(update=changes)
    return wire.sign_report(report, wire.report_topic(agent.config.device_id), agent.secrets.signing_key).to_bytes()


@pytest.fixture(params=["ed25519", "hmac-sha256"])
def fleet(fast_path, request):
    """(coordinator key, spec, the signed round, agents, messages of round r1: valid ones and crafted ones)."""
    key = wire.generate_signing_key()
    spec = SimFleetSpec(run_id="b", n_devices=N, shard_size=N, state_root=str(fast_path / "dev"),
                        coordinator_public_key=wire.public_key_b64(key))
    rc = wire.sign_round(wire.RoundConfig(round_id="r1", protocol="flower", epsilon=spec.max_round_epsilon,
                                          params=round_params(spec)), key)
    agents = [Agent(device_config(spec, i), secrets=new_identity(request.param), transport=False,
                    source=IterableSource([{"age": i % 16, "edu": (3 * i) % 16, "syn": (7 * i) % 360}] * 2)).open()
              for i in range(N)]
    try:
        msgs: list[tuple[str, bytes]] = []
        by_stream: dict[str, list[tuple[Agent, bytes]]] = {}
        for a in agents:
            for c in a.report("r1").commits:
                msgs.append((c.topic, c.payload))
                by_stream.setdefault(wire.decode_report(c.payload).stream, []).append((a, c.payload))
        crafted = []
        a, p = by_stream["syn"][0]  # OLH: hashed value outside [0, g)
        seed, _y = wire.decode_report(p).body["report"]
        crafted.append((a, _resigned(a, p, seq=100, body={"report": [seed, 10**6]})))
        a, p = by_stream["edu"][1]  # OUE: not a 0/1 vector
        crafted.append((a, _resigned(a, p, seq=101, body={"report": [2] + [0] * 15})))
        a, p = by_stream["age"][2]  # Hybrid: a real number, not a grid index (off_grid)
        crafted.append((a, _resigned(a, p, seq=102, body={"report": 1e6})))
        a, p = by_stream["syn"][3]  # wrong shape
        crafted.append((a, _resigned(a, p, seq=103, body={"report": [1, 2, 3]})))
        for a, p in crafted:
            msgs.insert(len(msgs) // 2, (wire.report_topic(a.config.device_id), p))
        tampered = json.loads(msgs[0][1])
        tampered["seq"] += 500
        msgs += [(msgs[0][0], json.dumps(tampered).encode()), msgs[1], (msgs[2][0], b"{not json")]
        yield key, spec, rc, agents, msgs
    finally:
        for a in agents:
            a.close()


def _verdicts(fast_path, name, key, rc, agents, msgs, batch: bool) -> list[str]:
    store = open_store(fast_path / f"{name}.sqlite3")
    try:
        validator = Validator(store)
        for a in agents:
            store.upsert_device(a.config.device_id, a.secrets.public_key_b64)
        validator.refresh_devices()
        store.put_round(rc.round_id, rc.model_dump_json())
        validator.set_round(rc, "open")
        if batch:
            return ["accepted" if not isinstance(r, wire.WireError) else r.reason
                    for r in validator.check_batch(msgs)]
        out = []
        for topic, payload in msgs:
            try:
                validator.check(topic, payload)
                out.append("accepted")
            except wire.WireError as exc:
                out.append(exc.reason)
        return out
    finally:
        store.close()


def test_batch_verdicts_are_the_message_by_message_verdicts(fast_path, fleet):
    key, spec, rc, agents, msgs = fleet
    plain = _verdicts(fast_path, "plain", key, rc, agents, msgs, batch=False)
    batch = _verdicts(fast_path, "batch", key, rc, agents, msgs, batch=True)
    assert batch == plain
    counts = Counter(plain)
    assert counts == {"accepted": 3 * N, "bad_body": 3, "off_grid": 1, "bad_signature": 1,
                      "duplicate": 1, "malformed": 1}


def test_flower_coordinator_ingest_batches_and_counts(fast_path, fleet):
    key, spec, rc, agents, msgs = fleet
    store = open_store(fast_path / "coord.sqlite3")
    try:
        settings = FlowerSettings(base_params=round_params(spec), epsilon=spec.max_round_epsilon)
        coord = FlowerCoordinator(store, key, settings)
        for a in agents:
            store.upsert_device(a.config.device_id, a.secrets.public_key_b64)
        coord.validator.refresh_devices()
        config = coord.rounds.open_round("r1", spec.max_round_epsilon, round_params(spec))
        # the devices' reports name round r1 of another key's signature: the round id and params are what count
        assert config.params == rc.params
        half = len(msgs) // 2
        acc1, rej1 = coord.ingest([t for t, _ in msgs[:half]], [p for _, p in msgs[:half]])
        acc2, rej2 = coord.ingest([t for t, _ in msgs[half:]], [p for _, p in msgs[half:]])
        assert acc1 + acc2 == 3 * N
        assert rej1 + rej2 == Counter({"bad_body": 3, "off_grid": 1, "bad_signature": 1,
                      "duplicate": 1, "malformed": 1})
        # a replayed reply (every message again) is all duplicates or rejections, nothing stored twice
        acc3, rej3 = coord.ingest([t for t, _ in msgs], [p for _, p in msgs])
        assert acc3 == 0 and rej3["duplicate"] == 3 * N + 1
    finally:
        store.close()
