"""DDRM behind its own honest interface: the difference trees (protocols/longitudinal/ddrm.py) derive
from the common longitudinal base, not the memoized one, so they carry no memo method they cannot honour — and every
public method and property they do expose works."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from protocols.longitudinal import (
    DDRM,
    LGRR,
    CategoricalDDRM,
    LongitudinalClient,
    LongitudinalProtocol,
    client_from_state,
    protocol_from_params,
)
from protocols.longitudinal.base import MemoizedClient, MemoizedProtocol
from protocols.longitudinal.ddrm import CategoricalDDRMClient, DDRMClient

#: What the memoized layer adds; a tree must have none of it.
MEMO_PROTOCOL_ATTRS = ("n_slots", "memo_slots", "_charge", "_init_fleet")
MEMO_CLIENT_ATTRS = ("_slot", "_draw_prr", "_irr", "secret", "memo", "memo_style", "_hmac_stream")


def _public(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_ddrm_source_has_no_not_implemented():
    source = Path(inspect.getfile(DDRM)).read_text()
    assert "NotImplementedError" not in source and "pragma: no cover" not in source


@pytest.mark.parametrize("protocol", [DDRM(1.0, horizon=8, max_nonzero=4), CategoricalDDRM(0.5, 3, 8, 1)],
                         ids=lambda p: p.name)
def test_trees_are_not_memoized_protocols(protocol):
    assert isinstance(protocol, LongitudinalProtocol) and not isinstance(protocol, MemoizedProtocol)
    client = protocol.client(rng=np.random.default_rng(0))
    assert isinstance(client, LongitudinalClient) and not isinstance(client, MemoizedClient)
    for name in MEMO_PROTOCOL_ATTRS:
        assert not hasattr(protocol, name), name
    for name in MEMO_CLIENT_ATTRS:
        assert not hasattr(client, name), name
    assert "secret" not in client.to_state() and "memo" not in client.to_state()
    # the memoized protocols keep them
    memo = LGRR(2.0, 1.0, 4)
    assert isinstance(memo, MemoizedProtocol) and all(hasattr(memo, n) for n in MEMO_PROTOCOL_ATTRS)
    assert all(hasattr(memo.client(), n) for n in MEMO_CLIENT_ATTRS)


def _check_exhaustive(obj, calls: dict) -> None:
    """Every public attribute of ``obj`` is exercised (a new inherited method fails here until it is covered): the
    callable checks are run, a ``None`` check means the test exercises that attribute itself."""
    assert _public(obj) == set(calls), sorted(_public(obj) ^ set(calls))
    for name, check in calls.items():
        if check is not None:
            result = check(getattr(obj, name))
            assert result is None or bool(result), name


def test_every_public_method_of_ddrm_works():
    p = DDRM(1.0, horizon=8, max_nonzero=6)
    rng = np.random.default_rng(1)
    streams = np.array([[0, 1, 1, 0, 0, 1, 1, 1], [1] * 8, [0] * 8])
    reports, _ = p.privatize_stream(streams, rng)

    def fleet_round(f):
        fleet = p.new_fleet(3, rng)
        out, charge = f(streams[:, 0], fleet, rng)
        assert out.shape == (3, 1) and charge.shape == (3,)

    def simulate(f):
        res = f(streams, rng)
        assert res.estimates.shape == (8,) and np.all(np.isfinite(res.estimates))
        np.testing.assert_allclose(res.charges.sum(axis=1), [p.charged_total(s) for s in streams])
        partial = f(streams, rng, estimate=[7])
        assert np.isnan(partial.estimates[:7]).all() and np.isfinite(partial.estimates[7])

    calls = {
        "name": lambda v: v == "DDRM",
        "epsilon": lambda v: v == 1.0,
        "epsilon_1": lambda v: v == 1.0,
        "epsilon_inf": lambda v: v == 1.0,
        "delta": lambda v: v == 0.0,
        "horizon": lambda v: v == 8,
        "max_nonzero": lambda v: v == 6,
        "levels": lambda v: v == 4,
        "n_nodes": lambda v: v == 15,
        "node_end": lambda v: v.shape == (15,),
        "node_start": lambda v: v.shape == (15,),
        "node_level": lambda v: v.shape == (15,),
        "released_by": lambda v: v[8] == 15,
        "c": lambda v: v > 1,
        "cost_nonzero_vs_zero": lambda v: 0 < v < 1,
        "cost_zero_vs_nonzero": lambda v: 0 < v < 1,
        "irr_input_epsilon": lambda v: v == 1.0,
        "device_parameter": lambda v: v is None,
        "client_class": lambda v: v is DDRMClient,
        "params": lambda f: protocol_from_params("DDRM", f()).params() == f(),
        "fingerprint": lambda f: len(f()) == 16,
        "for_changes": lambda f: f(1.0, 8, 2).max_nonzero == 8,
        "longitudinal_bound": lambda f: f() == pytest.approx(6.0) and f(2) == pytest.approx(2.0),
        "charged_total": lambda f: f([1] * 8) == pytest.approx(4.0),
        "transcript_epsilon_bound": lambda f: 0 < f([0, 1], [1, 1]) <= p.device_epsilon(2),
        "device_epsilon": lambda f: f(8) == pytest.approx(6.0),
        "node_values": lambda f: f(streams).shape == (3, 15),
        "prefix_nodes": lambda f: len(f(7)) == 3,
        "pair_loss": lambda f: f(np.array([1, 0]), np.array([-1, 0])) == pytest.approx(1.0),
        "privatize_stream": lambda f: f(streams, rng)[0].shape == (3, 15),
        "new_fleet": lambda f: f(3, rng).n == 3,
        "privatize_round": fleet_round,
        "estimate": lambda f: f(reports).shape == (8,),
        "estimate_round": lambda f: math.isfinite(f(reports)),
        "simulate_rounds": simulate,
        "variance": lambda f: f(7) == pytest.approx(3 * p.c**2),
        "client": lambda f: isinstance(f(secret=b"x" * 32, stream="s"), DDRMClient),
    }
    _check_exhaustive(p, calls)


def test_every_public_method_of_a_ddrm_client_works():
    p = DDRM.for_changes(1.0, horizon=8, changes=1)
    client = p.client(rng=np.random.default_rng(2))
    reps = [client.report(x) for x in (0, 1, 1)]
    assert client.spent == pytest.approx(sum(r.charge for r in reps)) and all(r.memo_key is None for r in reps)
    state = json.loads(json.dumps(client.to_state()))
    assert set(state) == {"protocol", "params", "stream", "device"}
    again = client_from_state(state, rng=np.random.default_rng(3))
    assert again.to_state() == state and again.spent == client.spent
    # a state saved before the split (it carried the device secret and an empty memo) still restores
    legacy = {**state, "secret": "00" * 32, "memo_style": "stateless", "memo": {}}
    assert client_from_state(legacy).to_state() == state
    _check_exhaustive(client, {
        "protocol": lambda v: v is p, "stream": lambda v: v == "default", "rng": lambda v: v is not None,
        "t": lambda v: v == 3, "last": lambda v: v == [1, 1, 0, 0], "used": lambda v: v == 2, "spent": None,
        "report": lambda f: f(1).report.shape == (3,),  # t = 4 releases levels 0, 1 and 2
        "to_state": lambda f: f()["device"]["t"] == 4,
        "from_state": lambda f: f(p, state).t == 3,
    })


def test_every_public_method_of_categorical_ddrm_and_its_client_works():
    p = CategoricalDDRM(0.5, 3, 8, 1)
    rng = np.random.default_rng(4)
    values = rng.integers(0, 3, size=(50, 8))
    calls = {
        "name": None, "epsilon": None, "epsilon_1": None, "epsilon_inf": None, "delta": None, "k": None,
        "horizon": None, "changes": None, "tree": None, "levels": None, "max_nonzero": None, "c": None,
        "irr_input_epsilon": None, "device_parameter": None, "client_class": None,
        "params": lambda f: protocol_from_params("DDRM-k", f()).params() == f(),
        "fingerprint": lambda f: len(f()) == 16,
        "longitudinal_bound": lambda f: f() == pytest.approx(p.device_epsilon(8)) and f(0) == 0.0,
        "charged_total": lambda f: f([0, 1, 2]) == pytest.approx(p.device_epsilon(3)),
        "transcript_epsilon_bound": lambda f: 0 < f([0, 1], [0, 2]) <= p.device_epsilon(2),
        "device_epsilon": lambda f: f(8) == pytest.approx(0.5 * p.max_nonzero),
        "step_charge": lambda f: sum(f(t) for t in range(1, 9)) == pytest.approx(p.device_epsilon(8)),
        "step": lambda f: len(f([-1] * p.levels, 0, 1, 2)[0]) == 2,
        "node_values": lambda f: f([0, 1]).shape == (3, 3),
        "variance": lambda f: f(0.0) == pytest.approx(p.c**2 * p.levels),
        "new_fleet": lambda f: f(5, rng).n == 5,
        "privatize_round": lambda f: f(values[:, 0], p.new_fleet(50, rng), rng)[0].shape == (50, 4),
        "estimate_round": lambda f: f(p.privatize_round(values[:, 0], p.new_fleet(50, rng), rng)[0]).shape == (3,),
        "round_counts": lambda f: f(p.privatize_round(values[:, 0], p.new_fleet(50, rng), rng)[0]).shape == (3,),
        "estimate_counts": lambda f: np.allclose(f(np.array([2.0, 0.0, -2.0]), 2), [p.c, 0.0, -p.c]),
        "simulate_rounds": lambda f: f(values, rng).estimates.shape == (8, 3),
        "client": lambda f: isinstance(f(secret=b"y" * 32, stream="s", rng=rng), CategoricalDDRMClient),
    }
    _check_exhaustive(p, calls)
    assert p.name == "DDRM-k" and p.epsilon == p.epsilon_1 == p.epsilon_inf == p.irr_input_epsilon == 0.5
    assert p.delta == 0.0 and p.device_parameter is None and p.client_class is CategoricalDDRMClient
    assert (p.k, p.horizon, p.changes, p.levels, p.max_nonzero) == (3, 8, 1, 4, 12) and p.tree.horizon == 8
    assert p.c == pytest.approx(p.tree.c)
    client = p.client(rng=rng)
    charges = [client.report(v).charge for v in (0, 0, 2)]
    assert client.spent == pytest.approx(sum(charges)) == pytest.approx(p.device_epsilon(3))
    state = json.loads(json.dumps(client.to_state()))
    assert client_from_state(state).to_state() == state
    _check_exhaustive(client, {
        "protocol": lambda v: v is p, "stream": lambda v: v == "default", "rng": lambda v: v is rng,
        "t": lambda v: v == 3, "used": lambda v: v > 0, "last": lambda v: len(v) == p.levels,
        "noisy": lambda v: len(v) == p.levels, "complete": lambda v: v is False, "spent": None, "report": None,
        "to_state": None, "from_state": lambda f: f(p, state).spent == client.spent,
    })
    for v in (1, 1, 1, 0, 2):
        client.report(v)
    assert client.complete and client.spent == pytest.approx(p.longitudinal_bound())
    with pytest.raises(ValueError, match="exhausted"):
        client.report(0)


def test_categorical_ddrm_transcript_bound_covers_the_exact_loss():
    """The inherited memo-slot bound understated it: "a, a" vs "a, b" changes three (node, indicator) bits."""
    p = CategoricalDDRM(1.0, 3, 4, 1)
    bound = p.transcript_epsilon_bound([0, 0], [0, 1])
    assert bound == pytest.approx(1.0 + 2 * p.tree.cost_zero_vs_nonzero)  # c1 + 3·c0 = ε + 2·c0 > ε
    assert bound > p.irr_input_epsilon * 1  # what the memo-slot rule (one differing report) would have said
    assert p.transcript_epsilon_bound([2, 1], [2, 1]) == 0.0
    with pytest.raises(ValueError, match="equal length"):
        p.transcript_epsilon_bound([0], [0, 1])
    with pytest.raises(ValueError, match="horizon"):
        p.transcript_epsilon_bound([0] * 5, [1] * 5)


def test_the_most_one_tree_can_charge_is_one_formula():
    """longitudinal_bound() and device_epsilon(horizon) — what the ledger charges (accounting.report_charge) — are
    one number, also when max_nonzero exceeds the nodes a tree has (here 7 nodes for T = 4)."""
    from protocols.accounting import memo_slots_bound, report_charge

    for p in (DDRM(0.5, horizon=4, max_nonzero=50), DDRM(0.5, horizon=16, max_nonzero=6),
              CategoricalDDRM(0.5, 3, 4, 1), CategoricalDDRM(0.5, 3, 16, 1)):
        assert p.longitudinal_bound() == p.device_epsilon(p.horizon)
        assert report_charge("ddrm", p, 0.5, "device") == p.longitudinal_bound()
    assert DDRM(0.5, horizon=4, max_nonzero=50).longitudinal_bound() == memo_slots_bound(0.5, 7)
