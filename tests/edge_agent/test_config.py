"""Agent configuration: TOML + environment overrides + secret files, with clear errors."""

from __future__ import annotations

import os
import stat

import pytest

from edge_agent.config import (
    ConfigError,
    apply_env_overrides,
    create_secrets,
    load_config,
    load_secrets,
    parse_config,
)
from protocols import wire

GOOD = """
device_id = "pi-0001"
state_dir = "state"
coordinator_public_key_file = "coordinator.pub"

[privacy]
epsilon = 1.0
max_round_epsilon = 3.0

[ledger]
total_cap = 100.0
stream_cap = 40.0
renewal_period_s = 86400

[[dimensions]]
name = "cpu"
kind = "numeric"
lo = 0.0
hi = 100.0
source = "cpu_percent"

[[dimensions]]
name = "mode"
kind = "categorical"
categories = ["idle", "busy", "boost"]

[[streams]]
name = "cpu"
dimensions = ["cpu"]
mechanism = "hybrid"

[[streams]]
name = "mode"
dimensions = ["mode"]
epsilon = 0.5

[[sources]]
kind = "system"

[mqtt]
host = "broker.local"
port = 8883
tls = true
ca_file = "ca.crt"
cert_file = "dev.crt"
key_file = "dev.key"
"""


def _base(**over):
    data = {
        "device_id": "d1",
        "state_dir": "/tmp/x",
        "dimensions": [{"name": "cpu", "kind": "numeric", "lo": 0, "hi": 100}],
        "ledger": {"total_cap": 10},
    }
    data.update(over)
    return data


def test_good_file_resolves_paths_and_defaults(tmp_path):
    (tmp_path / "agent.toml").write_text(GOOD)
    cfg = load_config(tmp_path / "agent.toml", environ={})
    assert cfg.device_id == "pi-0001"
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.mqtt.ca_file == tmp_path / "ca.crt" and cfg.mqtt.port == 8883
    assert cfg.coordinator_public_key_file == tmp_path / "coordinator.pub"
    assert cfg.signing_key_path == tmp_path / "state" / "device.key"
    assert cfg.dimension("mode").domain_size == 3
    assert cfg.dimension("cpu").field == "cpu_percent"
    mode = cfg.effective_streams()[1]
    assert cfg.stream_epsilon(mode) == 0.5 and cfg.stream_cap(mode) == 40.0


def test_environment_overrides(tmp_path):
    (tmp_path / "agent.toml").write_text(GOOD)
    env = {
        "HAARVEST_AGENT__MQTT__PORT": "1999",
        "HAARVEST_AGENT__MQTT__HOST": "10.0.0.5",
        "HAARVEST_AGENT__DIMENSIONS__0__HI": "80",
        "HAARVEST_AGENT__DEVICE_ID": "pi-0002",
        "HAARVEST_AGENT__LEDGER__TOTAL_CAP": "50.5",
        "UNRELATED": "1",
    }
    cfg = load_config(tmp_path / "agent.toml", environ=env)
    assert cfg.mqtt.port == 1999 and cfg.mqtt.host == "10.0.0.5"
    assert cfg.dimensions[0].hi == 80 and cfg.device_id == "pi-0002" and cfg.ledger.total_cap == 50.5
    with pytest.raises(ConfigError, match="no list item"):
        apply_env_overrides({"dimensions": []}, {"HAARVEST_AGENT__DIMENSIONS__3__HI": "1"})


@pytest.mark.parametrize(
    "over, message",
    [
        ({"dimensions": [{"name": "cpu", "kind": "numeric", "lo": 5, "hi": 5}]}, "lo must be < hi"),
        ({"dimensions": [{"name": "cpu", "kind": "numeric", "lo": 0}]}, "needs both lo and hi"),
        ({"dimensions": [{"name": "c", "kind": "categorical"}]}, "needs k"),
        ({"dimensions": [{"name": "c", "kind": "categorical", "k": 3, "lo": 0}]}, "takes k or categories"),
        ({"dimensions": [{"name": "c", "kind": "numeric", "lo": 0, "hi": float("inf")}]}, "finite"),
        ({"privacy": {"epsilon": 0}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": -1}}, "greater than 0"),
        ({"ledger": {"total_cap": 10, "stream_cap": 20}}, "exceeds total_cap"),
        ({"ledger": {}}, "ledger.total_cap: required key is missing"),
        ({"colour": "blue"}, "colour: unknown key"),
        ({"device_id": "bad/id"}, "device_id"),
        ({"streams": [{"name": "s", "dimensions": ["nope"]}]}, "unknown dimensions"),
        ({"streams": [{"name": "s", "dimensions": ["cpu"], "epsilon": 20}]}, "exceeds its cap"),
        ({"streams": [{"name": "s", "dimensions": ["cpu"], "epsilon_1": 1}]}, "epsilon_1 and epsilon_inf"),
        ({"streams": [{"name": "s", "dimensions": ["cpu"], "epsilon_1": 2, "epsilon_inf": 1}]}, "epsilon_1 must be <"),
        ({"mqtt": {"host": "h"}}, "needs the coordinator public key"),
        ({"mqtt": {"cert_file": "a"}, "schedule": "interval"}, "cert_file and key_file"),
        ({"coordinator_public_key": "not-a-key"}, "not a base64 raw Ed25519"),
        ({"sources": [{"kind": "replay"}]}, "needs path"),
    ],
)
def test_bad_configs_give_clear_errors(over, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_base(**over))


def test_unreadable_or_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("device_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")


def test_secrets_roundtrip_and_errors(tmp_path):
    cfg = parse_config(_base(state_dir=str(tmp_path / "s")))
    with pytest.raises(ConfigError, match="agent enroll"):
        load_secrets(cfg)
    created = create_secrets(cfg)
    for p in (cfg.signing_key_path, cfg.hmac_secret_path):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    loaded = load_secrets(cfg)
    assert loaded.public_key_b64 == created.public_key_b64 and loaded.hmac_secret == created.hmac_secret
    with pytest.raises(FileExistsError):
        create_secrets(cfg)
    cfg.hmac_secret_path.write_text("abcd\n")
    with pytest.raises(ConfigError, match=">= 32 bytes"):
        load_secrets(cfg)
    cfg.hmac_secret_path.write_text("zz" * 32)
    with pytest.raises(ConfigError, match="not hex"):
        load_secrets(cfg)
    cfg.signing_key_path.write_text("garbage")
    with pytest.raises(ConfigError, match="signing key file"):
        load_secrets(cfg)


def test_coordinator_key_file(tmp_path):
    key = wire.generate_signing_key()
    (tmp_path / "c.pub").write_text(wire.public_key_b64(key) + "\n")
    cfg = parse_config(_base(coordinator_public_key_file=str(tmp_path / "c.pub")))
    assert wire.public_key_b64(cfg.coordinator_key()) == wire.public_key_b64(key)
    cfg = parse_config(_base(coordinator_public_key_file=str(tmp_path / "nope.pub")))
    with pytest.raises(ConfigError, match="cannot read"):
        cfg.coordinator_key()
