"""A device configuration that follows rounds signed by a test coordinator key, and rounds signed with that key
(for test_pipeline.py, test_rounds.py and test_state.py), and the dimensions and streams of the round-contract
tests (test_plans.py, tests/system/test_round_contract.py)."""

from __future__ import annotations

from edge_agent.embed import categorical, numeric, simple_config
from protocols import wire

COORD = wire.generate_signing_key()


def round_config(tmp_path, dims, streams, ledger=None, **privacy):
    return simple_config("dev-0001", tmp_path / "d", dims, streams,
                         coordinator_public_key=wire.public_key_b64(COORD),
                         ledger=ledger or {"total_cap": 1e6},
                         privacy={"epsilon": 1.0, "max_round_epsilon": 10.0, **privacy})


def signed_round(rid, params, eps=10.0):
    return wire.sign_round(wire.RoundConfig(round_id=rid, protocol="t", epsilon=eps, params=params), COORD).to_bytes()


HYBRID_LOAD = [{"name": "load", "dimensions": ["load"], "mechanism": "hybrid", "epsilon": 1.0}]
GAUSS_LOAD = [{"name": "load", "dimensions": ["load"], "mechanism": "gaussian", "epsilon": 0.5,
               "params": {"delta": 1e-6}}]

#: a Haar record, a numeric, a frequency (auto) and a longitudinal stream
CONTRACT_DIMS = [numeric("age", 17, 90), numeric("hours", 1, 99), numeric("edu", 1, 16), numeric("load", 0, 100),
                 categorical("sex", 2), categorical("app", 6)]
CONTRACT_STREAMS = [
    {"name": "profile", "dimensions": ["age", "hours", "edu"], "mechanism": "haar", "epsilon": 2.0},
    {"name": "load", "dimensions": ["load"], "mechanism": "hybrid", "epsilon": 1.0},
    {"name": "sex", "dimensions": ["sex"], "epsilon": 1.0},
    {"name": "app", "dimensions": ["app"], "mechanism": "loloha", "epsilon_1": 1.0, "epsilon_inf": 2.0,
     "params": {"g": 3}},
]
