"""The `haarvest coordinator` CLI (coordinator/cli.py): enrolment, rounds, estimates, export, devices; errors in one
line."""

from __future__ import annotations

import json

import numpy as np

from coordinator import cli
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from tests.coordinator.test_api import PARAMS, _fill


def test_cli_hmac_devices_are_listed_without_their_key(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    dev = SimFleet(1, signature="hmac-sha256").enrollment()[0]
    assert cli.main(["coordinator", "enroll-device", "--db", db, "--id", dev["device_id"],
                     "--pubkey", dev["public_key"]]) == 0
    capsys.readouterr()
    assert cli.main(["coordinator", "enroll-device", "--db", db, "--id", "dev-x",
                     "--pubkey", "hmac-sha256:c2hvcnQ="]) == 2  # one line on stderr, nothing stored
    assert capsys.readouterr().err.strip().count("\n") == 0
    cli.main(["coordinator", "devices", "--db", db])
    out = capsys.readouterr().out
    assert dev["public_key"].split(":", 1)[1] not in out
    (row,) = json.loads(out)
    assert row["algorithm"] == "hmac-sha256" and len(row["key_id"]) == 16 and "public_key" not in row


def test_cli_enroll_rounds_estimate_export(tmp_path, capsys):
    db, key = str(tmp_path / "c.db"), str(tmp_path / "k")
    fleet = SimFleet(30)
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps(fleet.enrollment()[1:]))
    first = fleet.enrollment()[0]
    assert cli.main(["coordinator", "enroll-device", "--db", db, "--id", first["device_id"],
                     "--pubkey", first["public_key"]]) == 0
    assert cli.main(["coordinator", "enroll-device", "--db", db, "--json", str(devices)]) == 0
    assert cli.main(["coordinator", "enroll-device", "--db", db, "--id", "dev-x", "--pubkey", "not-a-key"]) == 2
    assert cli.main(["coordinator", "rounds", "open", "--db", db, "--key", key, "--id", "r1", "--epsilon", "2",
                     "--params", json.dumps(PARAMS), "--no-publish"]) == 0
    capsys.readouterr()
    cli.main(["coordinator", "devices", "--db", db])
    listing = json.loads(capsys.readouterr().out)
    assert len(listing) == 30 and all(d["algorithm"] == "ed25519" and d["public_key"] for d in listing)
    coord = Coordinator(CoordinatorConfig(db=db, key_file=key, mqtt=False))
    _fill(coord, fleet, "r1", np.random.default_rng(1))
    coord.close()
    assert cli.main(["coordinator", "estimate", "r1", "--db", db, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cpu"]["n"] == 30 and out["app"]["n"] == 30
    assert cli.main(["coordinator", "estimate", "r1", "--db", db]) == 0
    assert "r1/cpu" in capsys.readouterr().out
    assert cli.main(["coordinator", "export", "r1", "--db", db]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 60 and "report" in json.loads(lines[0])["body"]
    assert cli.main(["coordinator", "export", "--db", db, "--format", "csv", "--out", str(tmp_path / "x.csv")]) == 0
    assert len((tmp_path / "x.csv").read_text().strip().splitlines()) == 61
    assert cli.main(["coordinator", "rounds", "close", "--db", db, "--key", key, "--id", "r1", "--no-publish"]) == 0
    cli.main(["coordinator", "rounds", "list", "--db", db, "--key", key])
    assert '"closed"' in capsys.readouterr().out
    store = SQLiteStore(db)
    assert len(store.devices()) == 30
    store.close()


def test_cli_run_with_an_unusable_ca_file_exits_1_with_a_hint(tmp_path, capsys):
    """A TLS option that cannot work is reported by `coordinator run` in one line (exit 1), not as a traceback."""
    from simulations.broker import free_port

    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    rc = cli.main(["coordinator", "run", "--db", str(tmp_path / "c.db"), "--key", str(tmp_path / "c.key"),
                   "--mqtt-port", str(free_port()), "--mqtt-ca", str(bad)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "haarvest coordinator run:" in err and "is it running" in err
