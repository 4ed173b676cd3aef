"""``haarvest coordinator … --config FILE``: TOML keys = the run options, command line overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator import cli
from coordinator.run_config import RunConfigError, RunOptions, load_options, read_config_file
from haarvest.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "coordinator.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _opts(argv: list[str]) -> RunOptions:
    return cli._options(build_parser().parse_args(argv))


def test_defaults_file_and_command_line_precedence(tmp_path):
    assert _opts(["coordinator", "run"]) == RunOptions()
    conf = _write(tmp_path, 'db = "state/c.db"\nmqtt-port = 8883\nmqtt_ca = "/etc/ca.crt"\nbatch_ms = 5\n'
                            'http_port = 8080\nmqtt_protocol = 5\nshare_group = "g"\n')
    o = _opts(["coordinator", "run", "--config", str(conf)])
    assert o.db == str(tmp_path / "state" / "c.db")  # relative to the file's directory
    assert (o.mqtt_port, o.mqtt_ca, o.batch_ms, o.http_port, o.mqtt_protocol) == (8883, "/etc/ca.crt", 5.0, 8080, "5")
    assert o.tls and o.mqtt_host == "127.0.0.1" and o.key == "coordinator.key"  # defaults where the file is silent
    o = _opts(["coordinator", "run", "--config", str(conf), "--mqtt-port", "1883", "--db", "other.db",
               "--no-mqtt-tls", "--batch-ms", "20"])
    assert (o.mqtt_port, o.db, o.batch_ms) == (1883, "other.db", 20.0)  # the command line wins, paths as given
    assert o.tls  # a CA still means TLS
    # the same file serves the other subcommands (they take the keys they need)
    o = _opts(["coordinator", "rounds", "close", "--config", str(conf), "--id", "r1"])
    assert o.db == str(tmp_path / "state" / "c.db") and o.mqtt_port == 8883
    assert _opts(["coordinator", "estimate", "r1", "--config", str(conf)]).db == o.db


def test_db_urls_are_not_paths(tmp_path):
    assert read_config_file(_write(tmp_path, 'db = "postgresql://u@h/db"'))["db"] == "postgresql://u@h/db"
    assert read_config_file(_write(tmp_path, 'db = ":memory:"'))["db"] == ":memory:"
    assert read_config_file(_write(tmp_path, 'db = "sqlite:///x.db"'))["db"] == str(tmp_path / "x.db")
    assert read_config_file(_write(tmp_path, 'db = "/abs/x.db"\nkey = "k"'))["key"] == str(tmp_path / "k")


@pytest.mark.parametrize("text, expected", [
    ('mqtt_prot = "5"', "mqtt_prot: unknown key"),
    ('mqtt_port = "x"', "mqtt_port: Input should be a valid integer"),
    ("mqtt_port = 70000", "mqtt_port: Input should be less than or equal to 65535"),
    ("batch_size = 0", "batch_size: Input should be greater than or equal to 1"),
    ('mqtt_protocol = "4"', "mqtt_protocol: Input should be '5', '3.1.1' or 'auto'"),
    ('mqtt_cert = "c.crt"', "mqtt_cert and mqtt_key"),
    ('share_group = "a/b"', "share_group: must not contain"),
    ('mqtt_port = 1\nmqtt-port = 2', "given twice"),
    ("mqtt_port = ", "not valid TOML"),
    ('[mqtt]\nport = 1', "mqtt: unknown key"),
])
def test_bad_files_name_the_file_and_key(tmp_path, text, expected):
    conf = _write(tmp_path, text)
    with pytest.raises(RunConfigError) as err:
        load_options(conf)
    assert str(conf) in str(err.value) and expected in str(err.value), str(err.value)


def test_cli_exits_2_with_the_message(tmp_path, capsys):
    conf = _write(tmp_path, "batch_ms = -1\n")
    with pytest.raises(SystemExit) as err:
        cli.main(["coordinator", "run", "--config", str(conf)])
    assert err.value.code == 2
    msg = capsys.readouterr().err
    assert str(conf) in msg and "batch_ms: Input should be greater than 0" in msg
    with pytest.raises(SystemExit) as err:
        cli.main(["coordinator", "run", "--config", str(tmp_path / "missing.toml")])
    assert err.value.code == 2 and "cannot read config file" in capsys.readouterr().err
    # TLS files must exist before anything starts
    conf = _write(tmp_path, 'mqtt_ca = "nope/ca.crt"\n')
    with pytest.raises(SystemExit) as err:
        cli.main(["coordinator", "run", "--config", str(conf), "--db", str(tmp_path / "c.db")])
    assert err.value.code == 2 and "mqtt_ca = " in capsys.readouterr().err
    assert not (tmp_path / "c.db").exists()
    # the command line is validated the same way
    with pytest.raises(SystemExit) as err:
        cli.main(["coordinator", "run", "--mqtt-key", "k.pem"])
    assert err.value.code == 2 and "mqtt_cert and mqtt_key" in capsys.readouterr().err


def test_shipped_example_and_unit_parse():
    example = ROOT / "deploy" / "systemd" / "coordinator.toml.example"
    o = load_options(example)
    assert o.tls and o.mqtt_cert and o.mqtt_key and o.mqtt_port == 8883 and o.http_port == 8080
    unit = (ROOT / "deploy" / "systemd" / "haarvest-coordinator.service").read_text()
    assert "--config /etc/haarvest/coordinator.toml" in unit


def test_check_config_prints_effective_options(tmp_path, capsys):
    import json

    (tmp_path / "ca.crt").write_text("x")
    conf = _write(tmp_path, 'mqtt_ca = "ca.crt"\nmqtt_username = "u"\nmqtt_password = "secret"\n')
    assert cli.main(["coordinator", "check-config", "--config", str(conf), "--http-port", "9000"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["mqtt_ca"] == str(tmp_path / "ca.crt") and shown["tls"] and shown["http_port"] == 9000
    assert shown["mqtt_password"] == "***" and "secret" not in out


@pytest.mark.parametrize("doc", ["docs/coordinator.md", "deploy/README.md"])
def test_documented_config_examples_are_valid(tmp_path, doc):
    import re

    blocks = [b for b in re.findall(r"```toml\n(.*?)```", (ROOT / doc).read_text(), re.S) if "mqtt_port" in b]
    assert blocks, f"{doc} shows no coordinator configuration"
    for i, block in enumerate(blocks):
        o = load_options(_write(tmp_path, block, f"c{i}.toml"))
        assert o.tls and o.mqtt_cert and o.mqtt_key and o.mqtt_port == 8883
