"""Store + validation pipeline: every rejection reason, duplicates vs replays, persistence across reopen."""

from __future__ import annotations

import gc
import json

import pytest

from coordinator.rounds import RoundManager
from coordinator.simfleet import SimDevice, SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import wire
from tests.coordinator.support_rows import BAD_ROWS, GOOD_ROWS, SUPPORT_STREAMS

PARAMS = {"streams": {"cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0},
                              "dims": ["cpu"], "bounds": [[0, 100]]}}}


@pytest.fixture(params=["ed25519", "hmac-sha256"])
def setup(tmp_path, request):
    store = SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(3, signature=request.param)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    validator = Validator(store)
    rounds = RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round)
    rounds.open_round("r1", 1.0, PARAMS)
    yield store, fleet, validator, rounds
    store.close()


def reason(validator, topic, payload):
    with pytest.raises(wire.WireError) as err:
        validator.check(topic, payload)
    return err.value.reason


def test_accept_then_duplicate_then_already_reported(setup):
    store, fleet, v, _ = setup
    dev = fleet.devices[0]
    topic, payload = dev.report("r1", "cpu", "hybrid", {"report": 32})
    row = v.check(topic, payload)
    assert row.device_id == dev.device_id and json.loads(row.body) == {"report": 32}
    assert reason(v, topic, payload) == "duplicate"  # same batch (pending)
    assert store.commit_batch([row], {}) == 1
    v.batch_committed()
    assert reason(v, topic, payload) == "duplicate"  # now from the store
    topic2, payload2 = dev.report("r1", "cpu", "hybrid", {"report": 57})
    assert reason(v, topic2, payload2) == "already_reported"
    assert store.counters() == {"accepted": 1}


def test_rejection_reasons(setup):
    store, fleet, v, rounds = setup
    dev, other = fleet.devices[0], fleet.devices[1]
    topic, good = dev.report("r1", "cpu", "hybrid", {"report": 17})
    rep = wire.decode_report(good)
    resign = lambda **kw: wire.sign_report(rep.model_copy(update=kw), topic, dev.key).to_bytes()  # noqa: E731
    assert reason(v, topic, b"x" * (wire.MAX_PAYLOAD + 1)) == "too_large"
    assert reason(v, topic, b"{not json") == "malformed"
    assert reason(v, topic, b'{"v": 1}') == "schema"
    assert reason(v, "haarvest/v1/status/x", good) == "wrong_topic"
    assert reason(v, other.topic, good) == "device_mismatch"
    assert reason(v, topic, rep.model_copy(update={"sig": ""}).to_bytes()) == "unsigned"
    assert reason(v, topic, rep.model_copy(update={"seq": 99}).to_bytes()) == "bad_signature"
    assert reason(v, topic, wire.sign_report(rep, topic, other.key).to_bytes()) == "bad_signature"
    assert reason(v, topic, resign(round_id="nope")) == "unknown_round"
    assert reason(v, topic, resign(stream="mem")) == "wrong_stream"
    assert reason(v, topic, resign(mechanism="duchi")) == "wrong_mechanism"
    assert reason(v, topic, resign(body={"y": 1})) == "bad_body"
    assert reason(v, topic, resign(body={"report": "x"})) == "bad_body"
    stranger = SimFleet(1, prefix="stranger").devices[0]
    assert reason(v, *stranger.report("r1", "cpu", "hybrid", {"report": 7})) == "unknown_device"
    store.upsert_device(other.device_id, other.public_key, "revoked")
    v.refresh_devices()
    assert reason(v, *other.report("r1", "cpu", "hybrid", {"report": 7})) == "revoked_device"
    rounds.close_round("r1")
    assert reason(v, topic, good) == "round_closed"


def test_replay_below_high_water_mark(setup):
    store, fleet, v, rounds = setup
    rounds.open_round("r2", 1.0, PARAMS)
    dev = fleet.devices[2]
    old = dev.report("r1", "cpu", "hybrid", {"report": 17})  # seq 1, never delivered
    new = dev.report("r2", "cpu", "hybrid", {"report": 27})  # seq 2
    store.commit_batch([v.check(*new)], {})
    v.batch_committed()
    strict = Validator(store, replay_window=0)  # strict mode: nothing below the high-water mark
    assert reason(strict, *old) == "seq_regression"
    # a second process (fresh validator) sees the persisted high-water mark
    assert Validator(store)._hwm[dev.device_id] == 2
    assert reason(Validator(store, replay_window=0), *old) == "seq_regression"
    # with a replay window the late (never stored) seq 1 is accepted, exactly once
    win = Validator(store, replay_window=4)
    store.commit_batch([win.check(*old)], {})
    win.batch_committed()
    assert reason(win, *old) == "duplicate"


def test_a_late_report_is_accepted_by_default_and_receipted(setup):
    """Devices re-send what the coordinator has not receipted, so a report the broker lost arrives after later
    ones: by default it is stored (once); a receipt names it, a duplicate is receipted again, a rejection of an
    authentic report names its seq and reason, an unauthenticated message gets no receipt."""
    from coordinator.ingest import receipts_for

    store, fleet, v, rounds = setup
    rounds.open_round("r2", 1.0, PARAMS)
    dev = fleet.devices[2]
    old = dev.report("r1", "cpu", "hybrid", {"report": 17})  # seq 1, lost by the broker
    new = dev.report("r2", "cpu", "hybrid", {"report": 27})  # seq 2
    store.commit_batch([v.check(*new)], {})
    v.batch_committed()
    results = v.check_batch([old, new, dev.report("nope", "cpu", "hybrid", {"report": 7}),
                             (old[0], b"{")])
    kinds = [r.reason if isinstance(r, wire.WireError) else "ok" for r in results]
    assert kinds[:2] == ["ok", "duplicate"] and kinds[3] == "malformed"
    (topic, payload), = receipts_for(results)
    receipt = wire.decode_receipt(payload)
    assert topic == wire.receipt_topic(dev.device_id) and receipt.device_id == dev.device_id
    assert sorted(receipt.stored) == [1, 2] and [s for s, _ in receipt.rejected] == [3]


def test_not_after_and_params_validation(setup):
    store, fleet, v, rounds = setup
    rounds.open_round("late", 1.0, PARAMS, not_after=1.0)
    assert reason(v, *fleet.devices[0].report("late", "cpu", "hybrid", {"report": 7})) == "round_closed"
    with pytest.raises(ValueError, match="more than the round"):
        rounds.open_round("r3", 0.5, PARAMS)
    with pytest.raises(ValueError):
        rounds.open_round("r4", 1.0, {"streams": {"x": {"kind": "numeric", "mechanism": "nope", "dims": ["x"],
                                                        "bounds": [[0, 1]], "params": {"epsilon": 1}}}})
    with pytest.raises(ValueError, match="already exists"):
        rounds.open_round("r1", 1.0, PARAMS)


def test_signed_round_verifies_and_store_survives_reopen(tmp_path):
    key = wire.generate_signing_key()
    store = SQLiteStore(tmp_path / "s.db")
    cfg = RoundManager(store, key).open_round("r1", 1.0, PARAMS, depends_on=())
    wire.verify_round(wire.decode_round(cfg.to_bytes()), key.public_key())
    store.commit_batch([], {"bad_signature": 3})
    store.close()
    again = SQLiteStore(tmp_path / "s.db")
    assert again.counters() == {"bad_signature": 3}
    assert [r["round_id"] for r in again.rounds()] == ["r1"]


def test_round_opened_by_another_process_is_looked_up_at_once(tmp_path):
    """A round committed by another connection (the CLI) is known to the validator at the next report, however
    recently it re-read the rounds table; a miss is cached only for ``negative_ttl``."""
    store, cli_store = SQLiteStore(tmp_path / "c.db"), SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(2)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    cli = RoundManager(cli_store, wire.generate_signing_key())
    try:
        v = Validator(store, refresh_interval=3600.0, negative_ttl=3600.0)
        dev, dev2 = fleet.devices
        early = dev.report("r2", "cpu", "hybrid", {"report": 17})
        assert reason(v, *early) == "unknown_round"  # the id really does not exist yet: cached as missing
        cli.open_round("r2", 1.0, PARAMS)
        assert reason(v, *dev2.report("r2", "cpu", "hybrid", {"report": 17})) == "unknown_round"  # within the TTL
        v.negative_ttl = 0.0
        assert v.check(*dev2.report("r2", "cpu", "hybrid", {"report": 17})).round_id == "r2"
        cli.open_round("r3", 1.0, PARAMS)  # never asked about before: found at once despite the TTL
        v.negative_ttl = 3600.0
        assert v.check(*dev.report("r3", "cpu", "hybrid", {"report": 27})).round_id == "r3"
        assert v.known()["open_rounds"] == 2
        assert store.round("r3")["status"] == "open" and store.round("nope") is None
    finally:
        store.close()
        cli_store.close()


def test_round_closed_by_another_process_is_noticed_at_refresh(tmp_path):
    store, cli_store = SQLiteStore(tmp_path / "c.db"), SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(2)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    cli = RoundManager(cli_store, wire.generate_signing_key())
    try:
        cli.open_round("r1", 1.0, PARAMS)
        v = Validator(store, refresh_interval=0.0)
        assert v.check(*fleet.devices[0].report("r1", "cpu", "hybrid", {"report": 17})).round_id == "r1"
        cli.close_round("r1")
        assert reason(v, *fleet.devices[1].report("r1", "cpu", "hybrid", {"report": 17})) == "round_closed"
    finally:
        store.close()
        cli_store.close()


def test_validator_rejects_negative_intervals(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    try:
        with pytest.raises(ValueError, match="negative_ttl"):
            Validator(store, negative_ttl=-1)
    finally:
        store.close()


def test_registry_key_decides_the_algorithm(tmp_path):
    """A device registered with an HMAC key cannot pass with an Ed25519 signature, and vice versa; a report
    tagged with another device's HMAC key is rejected; a corrupt registry entry rejects, never crashes."""
    store = SQLiteStore(tmp_path / "c.db")
    mac, ed = SimFleet(1, "mac", signature="hmac-sha256").devices[0], SimFleet(1, "ed").devices[0]
    other = SimFleet(1, "x", signature="hmac-sha256").devices[0]
    store.upsert_device(mac.device_id, mac.public_key)
    store.upsert_device(ed.device_id, ed.public_key)
    store.upsert_device("broken", "hmac-sha256:c2hvcnQ=")
    v = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=v.set_round).open_round("r1", 1.0, PARAMS)
    assert v.check(*mac.report("r1", "cpu", "hybrid", {"report": 32})).device_id == mac.device_id
    assert v.check(*ed.report("r1", "cpu", "hybrid", {"report": 32})).device_id == ed.device_id
    for dev, key in [(mac, ed.key), (ed, mac.key), (mac, other.key)]:
        forged = SimDevice(dev.device_id, key, seq=100)
        assert reason(v, *forged.report("r1", "cpu", "hybrid", {"report": 57})) == "bad_signature"
    broken = SimDevice("broken", other.key)
    assert reason(v, *broken.report("r1", "cpu", "hybrid", {"report": 57})) == "unknown_device"
    store.close()


def test_check_batch_matches_message_by_message(setup):
    """A batch gives every message the outcome :meth:`Validator.check` gives it in arrival order: out-of-support
    rows (an index past hybrid's grid) are ``off_grid`` without costing their neighbours, a copy inside the
    batch is a ``duplicate``, an older, never stored seq after a newer one of the same device is accepted (a re-sent report)."""
    store, fleet, v, rounds = setup
    rounds.open_round("r2", 1.0, PARAMS)
    a, b, c = fleet.devices
    msgs = [a.report("r1", "cpu", "hybrid", {"report": 16000}),
            b.report("r1", "cpu", "hybrid", {"report": 99999}),       # off the grid
            b.report("r2", "cpu", "hybrid", {"report": 8000})]
    old_c = c.report("r1", "cpu", "hybrid", {"report": 3})
    new_c = c.report("r2", "cpu", "hybrid", {"report": 4})
    msgs += [msgs[0], new_c, old_c, ("haarvest/v1/reports/" + a.device_id, b"{")]
    results = v.check_batch(msgs)
    kinds = [r.reason if isinstance(r, wire.WireError) else "ok" for r in results]
    assert kinds == ["ok", "off_grid", "ok", "duplicate", "ok", "ok", "malformed"]  # a late seq is accepted
    assert store.commit_batch([r for r in results if not isinstance(r, wire.WireError)], {}) == 4
    v.batch_committed()
    # the out-of-support report reserved nothing: b's next report for r1 is still accepted
    assert v.check(*b.report("r1", "cpu", "hybrid", {"report": 107})).device_id == b.device_id


class _DownStore(SQLiteStore):
    """Reads fail while ``down`` (a locked or unreachable database)."""

    down = False

    def _exec(self, sql, args=(), commit=False):
        import sqlite3

        if self.down:
            raise sqlite3.OperationalError("injected: database is locked")
        return super()._exec(sql, args, commit)


def test_store_errors_raise_and_reload_is_all_or_nothing(tmp_path):
    """A store failure while checking a batch raises (the ingest retries the batch; it is never acknowledged as an
    internal_error), and a reload that fails changes nothing; once the store is back, a reload voids the
    reservations of a batch whose commit failed, so its retry accepts the same reports again."""
    import sqlite3

    store = _DownStore(tmp_path / "c.db")
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 1.0, PARAMS)
    validator = Validator(store, refresh_interval=0)
    fleet = SimFleet(2)
    for record in fleet.enrollment():  # enrolled after the validator loaded: pass 1 looks the device up
        store.upsert_device(record["device_id"], record["public_key"])
    messages = [dev.report("r1", "cpu", "hybrid", {"report": 57}) for dev in fleet.devices]
    store.down = True
    with pytest.raises(sqlite3.OperationalError):
        validator.check_batch(messages)
    before = (dict(validator._hwm), {k: set(v) for k, v in validator._reported.items()}, dict(validator._keys))
    with pytest.raises(sqlite3.OperationalError):
        validator.reload()
    assert (validator._hwm, validator._reported, validator._keys) == before
    store.down = False
    first = validator.check_batch(messages)
    assert all(not isinstance(r, wire.WireError) for r in first)
    # the commit of that batch failed: reload, then the retry sees the same reports as new
    validator.reload()
    again = validator.check_batch(messages)
    assert [r.seq for r in again] == [r.seq for r in first]


def test_closing_a_round_frees_its_reported_set(setup):
    store, fleet, v, rounds = setup
    for dev in fleet.devices:
        v.check(*dev.report("r1", "cpu", "hybrid", {"report": 57}))
    assert len(v._reported["r1"]) == len(fleet.devices)
    rounds.close_round("r1")
    assert "r1" not in v._reported
    assert reason(v, *fleet.devices[0].report("r1", "cpu", "hybrid", {"report": 57})) == "round_closed"


def test_rows_already_stored_count_as_duplicates_in_the_stored_counters(tmp_path):
    """A row the store drops as already stored (another worker stored it first, or a redelivery) is a stored
    ``duplicate``, as the in-process metrics count it, not silently nothing."""
    from coordinator.store import StoredReport

    store = SQLiteStore(tmp_path / "c.db")
    row = StoredReport(device_id="d1", seq=3, boot=1, round_id="r1", stream="s", mechanism="duchi",
                       body='{"report":107}', sig="x", received_at=0.0)
    assert store.commit_batch([row], {}) == 1
    assert store.commit_batch([row], {"bad_signature": 2}) == 0
    assert store.counters() == {"accepted": 1, "duplicate": 1, "bad_signature": 2}
    store.close()


# Reports outside the mechanism's support are rejected at ingest


def test_ingest_rejects_reports_outside_the_mechanisms_support(tmp_path):
    from coordinator.rounds import RoundManager
    from coordinator.simfleet import SimFleet
    from coordinator.store import SQLiteStore
    from coordinator.validate import Validator

    store = SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(1)
    dev = fleet.devices[0]
    store.upsert_device(dev.device_id, dev.public_key)
    v = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=v.set_round).open_round("r1", 20.0,
                                                                                       {"streams": SUPPORT_STREAMS})
    mech = {name: (spec.get("mechanism") or "haar") for name, spec in SUPPORT_STREAMS.items()}
    for name, rows in BAD_ROWS.items():
        for row in rows:
            with pytest.raises(wire.WireError) as err:
                v.check(*dev.report("r1", name, mech[name], {"report": row}))
            grid = SUPPORT_STREAMS[name]["kind"] in ("numeric", "vector", "haar")
            assert err.value.reason in ("off_grid", "bad_body"), (name, row)  # a real number is off any grid
            if grid and isinstance(row, (int, float)):  # one number: on the grid or not
                assert err.value.reason == "off_grid", (name, row)
    for name, row in GOOD_ROWS.items():
        v.check(*dev.report("r1", name, mech[name], {"report": row}))
    store.close()


def test_a_rejected_report_does_not_tie_its_batch_into_a_reference_cycle(setup):
    """A rejection kept as a result carries no traceback: one would hold check_batch's frame, and with it the whole
    batch, in a cycle only a full collection frees (the ingest worker runs them rarely)."""
    _, fleet, v, _ = setup
    dev = fleet.devices[0]
    topic, good = dev.report("r1", "cpu", "hybrid", {"report": 32})
    at = good.index(b'"sig":"') + 7
    forged = good[:at] + (b"B" if good[at:at + 1] == b"A" else b"A") + good[at + 1:]
    batch = [(topic, good), (topic, good), (topic, b"{not json"), (topic, forged), ("haarvest/v1/reports/nobody", good)]
    gc.collect()
    gc.disable()
    try:
        results = v.check_batch(batch)
        reasons = [getattr(r, "reason", "accepted") for r in results]
        assert reasons == ["accepted", "duplicate", "malformed", "bad_signature", "device_mismatch"]
        assert all(getattr(r, "__traceback__", None) is None for r in results)
        del results
        assert gc.collect() == 0  # nothing was left to the cyclic collector
    finally:
        gc.enable()
