"""The ledger's number is a true upper bound for the privacy unit it names — checked by exact enumeration.

Two units (edge_agent.config):

* ``device`` — the ledger's total bounds ln P[transcript | a]/P[transcript | b] of everything a device released,
  against *any* other reading sequence b;
* ``value`` — the total bounds the loss about each distinct value: for sequences with the same memo pattern.

Part 1 enumerates every pair of value sequences with τ ≤ 4 over small domains for every longitudinal protocol
and checks ``device_epsilon(τ)`` (device unit) and ``charged_total`` (value unit, same pattern) against the exact
whole-transcript loss. Part 2 runs the real :class:`~edge_agent.agent.Agent` (its SQLite ledger) on every sequence
of τ ≤ 3 and checks its ledger against the exact loss of the transcript it actually produced (fresh reports or
verbatim memo copies, as the agent did them); the negative control — a memoizing agent whose ledger is read under
the device unit — must be caught.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.sources import IterableSource
from protocols.hashing import hash_values
from protocols.longitudinal import DDRM, LGRR, CategoricalDDRM, LOLOHA, LOSUE, LSUE, RAPPOR, grr_chain, slot_pattern
from protocols.longitudinal.memo import encode_value
from protocols.longitudinal.rappor import bloom_indices
from tests.protocols.longitudinal.test_longitudinal_exact import grr_matrix, max_log_ratio, transcript_distribution

REL = 1e-9


def _node_loss(va: np.ndarray, vb: np.ndarray, c: float) -> float:
    """Exact worst-case loss between two DDRM node-value vectors: independent ±1 reports (fair coin for 0,
    P[+1] = 1/2 + v/(2c) otherwise), so each direction takes the worst bit per node."""
    pa, pb = 0.5 + 0.5 * np.ravel(va) / c, 0.5 + 0.5 * np.ravel(vb) / c
    fwd = np.maximum(np.log(pa / pb), np.log((1 - pa) / (1 - pb))).sum()
    bwd = np.maximum(np.log(pb / pa), np.log((1 - pb) / (1 - pa))).sum()
    return float(max(fwd, bwd))


def _pairs(k: int, tau: int):
    seqs = list(itertools.product(range(k), repeat=tau))
    return seqs, list(itertools.combinations(range(len(seqs)), 2))


def _check_all_pairs(protocol, k: int, tau: int, loss, slots=None) -> tuple[float, int]:
    """Every pair (a, b) of sequences over [k]^τ: loss ≤ device_epsilon(τ); same pattern: loss ≤ charged (value
    unit). Returns (the largest loss, how many differently-patterned pairs exceed the value unit's charge)."""
    seqs, pairs = _pairs(k, tau)
    slots = slots or (lambda s: protocol.memo_slots(list(s)))
    bound = protocol.device_epsilon(tau)
    worst, over_value = 0.0, 0
    for i, j in pairs:
        a, b = seqs[i], seqs[j]
        ell = loss(a, b)
        worst = max(worst, ell)
        assert ell <= bound * (1 + REL) + 1e-12, (a, b, ell, bound)
        charged = min(protocol.charged_total(list(a)), protocol.charged_total(list(b))) if slots else None
        if slot_pattern(slots(a)) == slot_pattern(slots(b)):
            assert ell <= charged * (1 + REL) + 1e-12, (a, b, ell, charged)
        elif ell > charged * (1 + REL):
            over_value += 1
    return worst, over_value


@pytest.mark.parametrize("eps_inf,eps_1", [(1.0, 0.9), (2.0, 1.0), (4.0, 0.5)])
@pytest.mark.parametrize("tau", [1, 2, 3, 4])
def test_lgrr_every_pair_within_device_and_value_charges(eps_inf, eps_1, tau):
    k = 3
    protocol = LGRR(eps_inf, eps_1, k)
    c = protocol.chain
    p1, p2 = grr_matrix(k, c.p1), grr_matrix(k, c.p2)
    cache: dict = {}

    def dist(seq):
        if seq not in cache:
            cache[seq] = transcript_distribution(p1, p2, list(seq), {s: s for s in seq})
        return cache[seq]

    worst, over_value = _check_all_pairs(protocol, k, tau, lambda a, b: max_log_ratio(dist(a), dist(b)))
    if tau == 1:
        assert worst == pytest.approx(eps_1)
    if tau >= 2 and (eps_inf, eps_1) == (1.0, 0.9):
        assert over_value > 0  # the value unit does not bound change times: (0,0) vs (0,1) exceeds it


def test_lgrr_audit_finding_is_within_the_device_charge():
    """The audit's pair: (0,0,1,1) vs (0,2,0,2), L-GRR(1, 0.9, k=4): 6.93 against 2 charged per value."""
    protocol = LGRR(1.0, 0.9, 4)
    c = protocol.chain
    p1, p2 = grr_matrix(4, c.p1), grr_matrix(4, c.p2)
    a, b = [0, 0, 1, 1], [0, 2, 0, 2]
    loss = max_log_ratio(transcript_distribution(p1, p2, a, {s: s for s in a}),
                         transcript_distribution(p1, p2, b, {s: s for s in b}))
    assert loss == pytest.approx(6.93, abs=0.01)
    assert loss > protocol.charged_total(a) == pytest.approx(2.0)
    assert loss <= protocol.device_epsilon(4)


@pytest.mark.parametrize("tau", [1, 2, 3, 4])
def test_loloha_every_pair_within_device_and_value_charges(tau):
    k, g = 3, 2
    protocol = LOLOHA(2.0, 1.0, k, g=g)
    seed = next(s for s in range(1, 10_000) if len(set(hash_values(s, np.arange(k), g).tolist())) == g)
    c = protocol.chain
    p1, p2 = grr_matrix(g, c.p1), grr_matrix(g, c.p2)

    def slots(seq):
        return protocol.memo_slots(list(seq), seed=seed)

    def dist(seq):
        s = slots(seq)
        return transcript_distribution(p1, p2, s, {h: h for h in s})

    charged = protocol.charged_total
    protocol.charged_total = lambda values, **kw: charged(values, seed=seed)  # the pinned device parameter
    _check_all_pairs(protocol, k, tau, lambda a, b: max_log_ratio(dist(a), dist(b)), slots=slots)


def _bitwise_loss(k_bits: int, bits_of, p1: float, q1: float, p2: float, q2: float, a, b) -> float:
    """Exact loss of a memoized unary/Bloom chain: bit positions are independent, so the worst transcript takes
    the worst pattern per bit; per bit, enumerate the PRR bits of the distinct values."""
    tau = len(a)
    outs = list(itertools.product((0, 1), repeat=tau))

    def bit_dist(seq, j):
        distinct = list(dict.fromkeys(seq))
        out = np.zeros(len(outs))
        for zs in itertools.product((0, 1), repeat=len(distinct)):
            z = dict(zip(distinct, zs))
            w = math.prod((p1 if j in bits_of(v) else q1) if z[v] else (1 - (p1 if j in bits_of(v) else q1))
                          for v in distinct)
            for o, y in enumerate(outs):
                w_y = 1.0
                for t in range(tau):
                    one = p2 if z[seq[t]] else q2
                    w_y *= one if y[t] else 1 - one
                out[o] += w * w_y
        return out

    fwd = bwd = 0.0
    for j in range(k_bits):
        pa, pb = bit_dist(a, j), bit_dist(b, j)
        fwd += float(np.log(pa / pb).max())
        bwd += float(np.log(pb / pa).max())
    return max(fwd, bwd)


@pytest.mark.parametrize("cls", [LSUE, LOSUE])
@pytest.mark.parametrize("tau", [1, 2, 3])
def test_unary_chains_every_pair_within_device_and_value_charges(cls, tau):
    k = 3
    protocol = cls(2.0, 1.0, k)
    c = protocol.chain
    worst, _ = _check_all_pairs(protocol, k, tau,
                                lambda a, b: _bitwise_loss(k, lambda v: {v}, c.p1, c.q1, c.p2, c.q2, a, b))
    if tau == 1:
        assert worst == pytest.approx(1.0)


@pytest.mark.parametrize("tau", [1, 2, 3])
def test_rappor_every_pair_within_device_and_value_charges(tau):
    m, h = 4, 1
    protocol = RAPPOR(num_bits=m, num_hashes=h, num_cohorts=1, f=0.5, p=0.4, q=0.8)
    bits = {v: set(bloom_indices(encode_value(v), 0, m, h)) for v in range(3)}
    f = protocol.f
    _check_all_pairs(protocol, 3, tau,
                     lambda a, b: _bitwise_loss(m, bits.__getitem__, 1 - f / 2, f / 2, protocol.q, protocol.p, a, b))


@pytest.mark.parametrize("tau", [1, 2, 3, 4])
def test_ddrm_every_pair_within_the_change_bounded_device_charge(tau):
    protocol = DDRM.for_changes(1.0, horizon=4, changes=1)
    seqs = list(itertools.product((0, 1), repeat=tau))
    bound = protocol.device_epsilon(tau)
    for a, b in itertools.combinations(seqs, 2):
        loss = _node_loss(protocol.node_values(np.array(a)), protocol.node_values(np.array(b)), protocol.c)
        assert loss <= bound * (1 + REL) + 1e-12
    # the charge grows with the tree's nodes only up to the change budget, not with the number of reports
    assert protocol.device_epsilon(4) == protocol.max_nonzero * 1.0 < 4 * protocol.irr_input_epsilon + 4


@pytest.mark.parametrize("changes", [0, 1])
def test_categorical_ddrm_every_pair_within_its_change_bounded_charge(changes):
    """Every pair of streams over k = 3 with τ ≤ 4: nodes × indicators are independent (fair coin or ε-RR), so the
    exact worst case takes the worst bit per pair; the reports (prefix sums) are a post-processing of these."""
    protocol = CategoricalDDRM(0.5, 3, horizon=4, changes=changes)
    c = protocol.c
    for tau in range(1, 5):
        bound = protocol.device_epsilon(tau)
        for a, b in itertools.combinations(list(itertools.product(range(3), repeat=tau)), 2):
            loss = _node_loss(protocol.node_values(list(a)), protocol.node_values(list(b)), c)
            assert loss <= bound * (1 + REL) + 1e-12, (a, b)
            # the protocol's stated pair bound is the exact loss, for every pair
            assert protocol.transcript_epsilon_bound(list(a), list(b)) == pytest.approx(loss, rel=1e-12, abs=1e-12)
    # the charge stops growing once the change budget is covered: (2·changes + 1)·levels nodes
    assert protocol.device_epsilon(4) == pytest.approx(0.5 * min(protocol.max_nonzero, 3 * 7))


# --- Part 2: the real agent and its ledger ---------------------------------------------------------------------


def _run_agent(tmp_path, name: str, values, stream: dict, unit: str, k: int = 3):
    cfg = simple_config(name, tmp_path / name, [categorical("x", k)], [stream], total_cap=1e6,
                        privacy={"unit": unit, "max_round_epsilon": 100.0})
    agent = Agent(cfg, IterableSource([{"x": int(v)} for v in values]), secrets=new_identity(),
                  transport=False).open()
    commits = []
    for t in range(len(values)):
        out = agent.report(f"r{t}")
        assert not out.refused
        commits += out.commits
    total = agent.state.spent()
    units = {r["unit"] for r in agent.state.ledger_rows()}
    memo_entries = agent.state.status()["memo_entries"]
    agent.close()
    return commits, total, units, memo_entries


def _loss(a: np.ndarray, b: np.ndarray) -> float:
    """max over transcripts of |ln P[y | a]/P[y | b]| (inf where one side has probability 0 and the other not)."""
    if np.any((a > 0) != (b > 0)):
        return math.inf
    both = a > 0
    return float(np.abs(np.log(a[both]) - np.log(b[both])).max())


def _agent_exact(tmp_path, unit: str, stream: dict, model, tau_max: int = 3, k: int = 3):
    """Run the agent on every sequence of τ ≤ tau_max; return [(a, b, exact loss, ledger(a), ledger(b))]."""
    out = []
    for tau in range(1, tau_max + 1):
        seqs = list(itertools.product(range(k), repeat=tau))
        runs = {}
        for i, s in enumerate(seqs):
            commits, total, units, memo = _run_agent(tmp_path, f"{unit}-{tau}-{i}", s, stream, unit, k)
            assert units <= {unit}
            runs[s] = (model(s, commits), total, memo)
        for a, b in itertools.combinations(seqs, 2):
            out.append((a, b, _loss(runs[a][0], runs[b][0]), runs[a][1], runs[b][1], runs[a][2]))
    return out


GRR_STREAM = {"name": "x", "dimensions": ["x"], "mechanism": "grr", "epsilon": 1.0}


def _grr_model(values, commits):
    """The exact distribution of the transcript the agent produced: a fresh GRR(ε = 1) report, or — for a memo
    hit — a verbatim copy of the report first sent for that memo key (the stream, spec and value)."""
    src = []
    for t, c in enumerate(commits):
        src.append(values.index(values[t]) if c.memo_hit else None)
    m = grr_matrix(3, math.exp(1.0) / (math.exp(1.0) + 2))
    out = np.zeros((3,) * len(values))
    for y in itertools.product(range(3), repeat=len(values)):
        w = 1.0
        for t, v in enumerate(values):
            w *= m[v, y[t]] if src[t] is None else float(y[t] == y[src[t]])
        out[y] = w
    return out


def test_agent_device_unit_ledger_bounds_every_exact_transcript_loss(tmp_path):
    rows = _agent_exact(tmp_path, "device", GRR_STREAM, _grr_model)
    for a, b, loss, led_a, led_b, memo in rows:
        assert memo == 0  # nothing memoized under the device unit
        assert led_a == pytest.approx(len(a) * 1.0) and led_b == pytest.approx(len(b) * 1.0)
        assert loss <= min(led_a, led_b) * (1 + REL), (a, b, loss, led_a)


def test_negative_control_memoized_agent_read_under_the_device_unit_is_caught(tmp_path):
    """The default before privacy units: memo hits re-sent verbatim and charged 0. Read as a device-level ledger,
    its total is exceeded — (x, x) and (x, y) are told apart with certainty."""
    rows = _agent_exact(tmp_path, "value", GRR_STREAM, _grr_model, tau_max=2)
    violations = [(a, b, loss, led_a) for a, b, loss, led_a, led_b, _ in rows if loss > min(led_a, led_b) + 1e-9]
    assert violations
    assert any(math.isinf(v[2]) for v in violations)
    # ... while the value unit's own claim holds: same memo pattern ⇒ loss ≤ ε per distinct value
    for a, b, loss, led_a, led_b, _ in rows:
        if slot_pattern(a) == slot_pattern(b):
            assert loss <= min(led_a, led_b) * (1 + REL)


@pytest.mark.parametrize("unit", ["device", "value"])
def test_agent_longitudinal_chain_ledger_bounds_the_exact_loss_for_its_unit(tmp_path, unit):
    stream = {"name": "x", "dimensions": ["x"], "mechanism": "lgrr", "epsilon_inf": 2.0, "epsilon_1": 1.0}
    c = grr_chain(2.0, 1.0, 3)
    p1, p2 = grr_matrix(3, c.p1), grr_matrix(3, c.p2)

    def model(values, commits):
        return transcript_distribution(p1, p2, list(values), {s: s for s in values})

    rows = _agent_exact(tmp_path, unit, stream, model)
    irr = LGRR(2.0, 1.0, 3).irr_input_epsilon
    for a, b, loss, led_a, led_b, _ in rows:
        if unit == "device":
            assert led_a == pytest.approx(len(a) * irr)
            assert loss <= min(led_a, led_b) * (1 + REL)
        elif slot_pattern(a) == slot_pattern(b):
            assert loss <= min(led_a, led_b) * (1 + REL)


NUMERIC_STREAMS = [
    {"name": "s", "dimensions": ["u"], "mechanism": "hybrid", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u"], "mechanism": "piecewise", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u"], "mechanism": "duchi", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u"], "mechanism": "auto", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u", "v", "w"], "mechanism": "ksampling", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u", "v", "w"], "mechanism": "duchi_md", "epsilon": 1.0},
    {"name": "s", "dimensions": ["u", "v", "w"], "mechanism": "haar", "epsilon": 1.0},
]


@pytest.mark.parametrize("stream", NUMERIC_STREAMS, ids=lambda s: f"{s['mechanism']}-{len(s['dimensions'])}")
def test_agent_numeric_streams_under_the_device_unit_are_fresh_and_fully_charged(tmp_path, stream):
    """Continuous mechanisms: every report is a fresh draw (a verbatim copy would have infinite loss against a
    changed value), so the transcript's loss is the sum of the per-report ε (each checked exactly in
    test_numeric.py) and the ledger charges exactly that — whether or not the (rounded) value changed."""
    dims = [numeric(n, 0, 100) for n in ("u", "v", "w")]
    readings = [{"u": 40.0, "v": 1.0, "w": 2.0}] * 3 + [{"u": 41.0, "v": 1.0, "w": 2.0}]
    cfg = simple_config("dev-n", tmp_path / "n", dims, [stream], total_cap=1e6)
    assert cfg.privacy.unit == "device"  # the default
    agent = Agent(cfg, IterableSource(readings), secrets=new_identity(), transport=False).open()
    draws = []
    maker = agent.pipeline._body_maker

    def counting(plan, x):  # count privatizations: each report must be a fresh draw
        make = maker(plan, x)
        return lambda: draws.append(1) or make()

    agent.pipeline._body_maker = counting
    for t in range(4):
        out = agent.report(f"r{t}")
        assert len(out.commits) == 1 and not out.commits[0].memo_hit
        assert out.commits[0].charged == pytest.approx(1.0)
    assert len(draws) == 4  # fresh randomness every time, also for the repeated reading
    assert agent.state.spent() == pytest.approx(4.0) and agent.state.status()["memo_entries"] == 0
    assert agent.state.spent_by_unit() == {"device": pytest.approx(4.0)}
    agent.close()


def test_memoize_needs_the_value_unit(tmp_path):
    from edge_agent.config import ConfigError

    with pytest.raises(ConfigError, match="memoize = true needs unit = 'value'"):
        simple_config("d", tmp_path / "s", [categorical("x", 3)],
                      [{"name": "x", "dimensions": ["x"], "memoize": True}])
    cfg = simple_config("d", tmp_path / "s", [categorical("x", 3)],
                        [{"name": "x", "dimensions": ["x"], "unit": "value"}])
    assert cfg.stream_memoizes(cfg.streams[0]) and cfg.stream_unit(cfg.streams[0]) == "value"


DDRM_STREAM = {"name": "x", "dimensions": ["x"], "mechanism": "ddrm", "epsilon": 0.5,
               "params": {"horizon": 4, "changes": 1}}


def test_agent_ddrm_stream_charges_by_changes_not_reports_and_bounds_every_exact_loss(tmp_path):
    protocol = CategoricalDDRM(0.5, 3, 4, 1)
    c = protocol.c
    for tau in (1, 2, 3):
        seqs = list(itertools.product(range(3), repeat=tau))
        ledgers = {s: _run_agent(tmp_path, f"t{tau}-{i}", s, DDRM_STREAM, "device")[1] for i, s in enumerate(seqs)}
        assert set(np.round(list(ledgers.values()), 9)) == {round(protocol.device_epsilon(tau), 9)}
        for a, b in itertools.combinations(seqs, 2):
            loss = _node_loss(protocol.node_values(list(a)), protocol.node_values(list(b)), c)
            assert loss <= min(ledgers[a], ledgers[b]) * (1 + REL) + 1e-12
    # 10 reports: two complete trees of 4 and a third started; a tree costs at most M·ε = 6·0.5 whatever the reports
    commits, total, units, _ = _run_agent(tmp_path, "long", [0, 0, 1, 1, 1, 2, 2, 2, 0, 0], DDRM_STREAM, "device")
    assert units == {"device"} and [int(np.asarray(c.body["report"])[0]) for c in commits] == [1, 2, 3, 4] * 2 + [1, 2]
    assert total == pytest.approx(2 * protocol.device_epsilon(4) + protocol.device_epsilon(2))
    assert protocol.device_epsilon(4) == pytest.approx(0.5 * protocol.max_nonzero) and protocol.max_nonzero < 4 * 3


def test_ddrm_stream_is_device_unit_and_a_refused_report_does_not_advance_its_tree(tmp_path):
    from edge_agent.config import ConfigError

    from edge_agent.pipeline import Pipeline

    with pytest.raises(ConfigError, match="device unit"):
        Pipeline(simple_config("d", tmp_path / "v", [categorical("x", 3)], [DDRM_STREAM], privacy={"unit": "value"}),
                 bytes(32))
    cfg = simple_config("d", tmp_path / "s", [categorical("x", 3)], [DDRM_STREAM], total_cap=5.0)
    agent = Agent(cfg, IterableSource([{"x": 1}] * 5), secrets=new_identity(), transport=False).open()
    charges = [agent.report(f"r{t}").commits[0].charged for t in range(4)]
    assert charges == pytest.approx([1.5, 3.0, 0.0, 0.0])  # ε·min(M = 9, 3·R(t)) increments: the tree is paid for
    assert agent.report("r4").refused == [("x", "stream_cap")]  # a new tree's first step (1.5) exceeds the cap left
    agent.close()
    again = Agent(cfg, IterableSource([{"x": 1}]), secrets=new_identity(), transport=False).open()
    assert again.report("r5").refused == [("x", "stream_cap")]  # the refused step was not taken, across a restart
    assert again.pipeline._trees["x"]["client"]["device"]["t"] == 4 and again.state.spent() == pytest.approx(4.5)
    again.close()


def test_ddrm_round_is_validated_and_decoded_by_the_coordinator(tmp_path):
    from coordinator.estimate import estimate_round
    from coordinator.rounds import RoundManager
    from coordinator.store import SQLiteStore
    from coordinator.validate import Validator
    from protocols import wire

    key = wire.generate_signing_key()
    store = SQLiteStore(tmp_path / "c.db")
    v = Validator(store)
    rounds = RoundManager(store, key, on_change=v.set_round)
    rng = np.random.default_rng(5)
    n, values = 400, rng.choice(3, 400, p=[0.6, 0.3, 0.1])
    agents = []
    for i in range(n):
        cfg = simple_config(f"dd-{i}", tmp_path / f"a{i}", [categorical("x", 3)],
                            [{**DDRM_STREAM, "epsilon": 2.0}], total_cap=100.0,
                            coordinator_public_key=wire.public_key_b64(key), privacy={"max_round_epsilon": 50.0})
        a = Agent(cfg, IterableSource([{"x": int(values[i])}] * 3), secrets=new_identity(), transport=False).open()
        store.upsert_device(cfg.device_id, a.secrets.public_key_b64)
        agents.append(a)
    for rid in ("r1", "r2", "r3"):
        rc = rounds.open_round(rid, 50.0, {"streams": agents[0].stream_specs()})
        accepted = [v.check(wire.report_topic(a.config.device_id), a.handle_round(rc.to_bytes()).commits[0].payload)
                    for a in agents]
        store.commit_batch(accepted, {})
        v.batch_committed()
        est = estimate_round(store, rid, level=0.999)["x"]
        assert est.error is None and est.n == n and est.kind == "longitudinal" and est.unit == "device"
        truth = np.bincount(values, minlength=3) / n
        assert np.all(np.asarray(est.ci_low) <= truth) and np.all(truth <= np.asarray(est.ci_high)), (rid, est)
    for a in agents:
        a.close()


def test_ddrm_tree_charges_cover_the_whole_tree_in_a_sliding_window(tmp_path):
    """With renewal_period_s = P a tree's charges count until the tree's end (start + P), not only at their own
    time: a new tree may start only when the old tree's charges have left every window that could see its
    releases. Without ``until`` the first charge (t = 0) would leave the window at 100.5 and the new tree fit."""
    now = [0.0]
    cfg = simple_config("d", tmp_path / "w", [categorical("x", 3)], [DDRM_STREAM],
                        ledger={"total_cap": 5.0, "renewal_period_s": 100.0})
    agent = Agent(cfg, IterableSource([{"x": 1}] * 6), secrets=new_identity(), transport=False,
                  clock=lambda: now[0]).open()
    for t in range(4):
        now[0] = float(t)
        agent.report(f"r{t}")
    assert [r["until"] for r in agent.state.ledger_rows()] == [100.0, 100.0]  # 1.5 at t = 0, 3.0 at t = 1
    now[0] = 100.5  # a new tree (the old one ended at 100); the window (0.5, 100.5] still sees the old tree
    assert agent.report("r4").refused == [("x", "stream_cap")]
    now[0] = 200.5  # the old tree has left every window
    assert agent.report("r5").commits[0].charged == pytest.approx(1.5)
    agent.close()
