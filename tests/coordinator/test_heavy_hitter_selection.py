"""Heavy-hitter selection in the round contract and the coordinator: ``threshold`` and ``top_k``
in HeavyHitterSpec (optional, absent from the JSON when unset), the estimate's ``heavy_hitters``, the planner."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from coordinator.cli import _with_selection
from coordinator.estimate import estimate_stream, select_heavy_hitters
from coordinator.rounds import heavy_hitters_from_estimate, plan_heavy_hitters
from protocols import catalogue
from protocols.contract import HeavyHitterSpec, StreamSpec, heavy_hitter_items, parse_round_params
from protocols.heavy_hitters import PrefixExtensionHeavyHitters, extend_prefixes

OLD_JSON = '{"bits":6,"prefix_bits":2,"step_bits":2,"candidates":[1,2]}'


def _stream(hh: HeavyHitterSpec) -> dict:
    return {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 3.0, "k": hh.k}, "dims": ["site"],
            "heavy_hitters": json.loads(hh.model_dump_json())}


def test_contract_json_round_trip_without_the_new_fields_is_unchanged():
    spec = HeavyHitterSpec.model_validate_json(OLD_JSON)
    assert spec.threshold is None and spec.top_k is None
    assert spec.model_dump_json() == OLD_JSON
    assert set(spec.model_dump()) == {"bits", "prefix_bits", "step_bits", "candidates"}
    params = parse_round_params({"streams": {"site": _stream(spec)}})
    dumped = json.loads(params.model_dump_json())
    assert dumped["streams"]["site"]["heavy_hitters"] == json.loads(OLD_JSON)
    assert parse_round_params(dumped) == params


def test_contract_json_round_trip_with_the_new_fields():
    spec = HeavyHitterSpec(bits=6, prefix_bits=2, step_bits=2, candidates=[1, 2], threshold=0.05, top_k=3)
    text = spec.model_dump_json()
    assert json.loads(text) == {**json.loads(OLD_JSON), "threshold": 0.05, "top_k": 3}
    assert HeavyHitterSpec.model_validate_json(text) == spec
    only_k = HeavyHitterSpec.model_validate({**json.loads(OLD_JSON), "top_k": 2})
    assert json.loads(only_k.model_dump_json()) == {**json.loads(OLD_JSON), "top_k": 2}
    params = parse_round_params({"streams": {"site": _stream(spec)}})
    assert parse_round_params(json.loads(params.model_dump_json())).streams["site"].heavy_hitters == spec


@pytest.mark.parametrize("extra, match", [
    ({"threshold": 1.5}, "less than or equal to 1"),
    ({"threshold": -0.01}, "greater than or equal to 0"),
    ({"threshold": True}, "threshold must be a frequency"),
    ({"top_k": 0}, "greater than or equal to 1"),
    ({"top_k": 2.0}, "top_k must be an integer"),
    ({"top_k": True}, "top_k must be an integer"),
])
def test_contract_refuses_bad_selection(extra, match):
    with pytest.raises(ValueError, match=match):
        HeavyHitterSpec.model_validate({**json.loads(OLD_JSON), **extra})


def test_select_heavy_hitters_threshold_top_k_and_default():
    hh = HeavyHitterSpec(bits=4, prefix_bits=0, step_bits=2, candidates=[0])  # k = 5, the last is "other"
    f = np.array([0.30, 0.02, 0.45, 0.10, 0.13])
    se = np.full(5, 0.01)
    np.testing.assert_array_equal(select_heavy_hitters(hh, f, se), [2, 0, 3])  # > 3·se; catch-all excluded
    np.testing.assert_array_equal(select_heavy_hitters(hh, f, se, max_candidates=2), [2, 0])
    with_t = hh.model_copy(update={"threshold": 0.2})
    np.testing.assert_array_equal(select_heavy_hitters(with_t, f, se), [2, 0])
    with_k = hh.model_copy(update={"top_k": 1})
    np.testing.assert_array_equal(select_heavy_hitters(with_k, f, se, max_candidates=16), [2])
    both = hh.model_copy(update={"threshold": 0.4, "top_k": 3})  # the threshold stays a floor
    np.testing.assert_array_equal(select_heavy_hitters(both, f, se), [2])
    with pytest.raises(ValueError, match="k = 5"):
        select_heavy_hitters(hh, f[:4], se[:4])


def test_estimate_lists_heavy_hitters_and_the_planner_carries_the_options():
    rng = np.random.default_rng(5)
    values = np.repeat(np.array([0b101101, 0b111111, 0b100000, 0b101100]), [8000, 4000, 1000, 500])
    hh = HeavyHitterSpec(bits=6, prefix_bits=0, step_bits=2, candidates=[0], top_k=2)
    spec = StreamSpec.model_validate(_stream(hh))
    oracle = catalogue.build("oue", epsilon=3.0, k=hh.k)
    est = estimate_stream(spec, [spec.entry.encode_row(oracle, r)
                                 for r in oracle.privatize(heavy_hitter_items(hh, values), rng)])
    assert [h["prefix"] for h in est.heavy_hitters] == [0b10, 0b11]
    assert est.heavy_hitters[0]["label"] == "10" and est.heavy_hitters[0]["bits"] == 2
    assert est.to_dict()["heavy_hitters"] == est.heavy_hitters
    assert heavy_hitters_from_estimate(hh, est) == [(h["prefix"], h["frequency"]) for h in est.heavy_hitters]
    nxt = plan_heavy_hitters(hh, est)
    assert nxt is not None and nxt.candidates == [0b10, 0b11] and nxt.top_k == 2 and nxt.threshold is None
    plain = estimate_stream(spec.model_copy(update={"heavy_hitters": None, "labels": None}), est.raw)
    assert plain.heavy_hitters == []


def test_rounds_next_selection_options_set_every_heavy_hitter_stream():
    hh = HeavyHitterSpec.model_validate_json(OLD_JSON)
    base = {"streams": {"site": _stream(hh)}}
    assert _with_selection(base, None, None) is base
    out = _with_selection(base, 0.05, 3)
    assert out["streams"]["site"]["heavy_hitters"] == {**json.loads(OLD_JSON), "threshold": 0.05, "top_k": 3}
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        _with_selection(base, None, 0)
    no_hh = {"streams": {"site": {k: v for k, v in _stream(hh).items() if k != "heavy_hitters"}}}
    no_hh["streams"]["site"]["params"] = {"epsilon": 3.0, "k": 4}
    with pytest.raises(ValueError, match="no stream of the round has heavy_hitters"):
        _with_selection(no_hh, 0.05, None)


def test_top_k_never_exceeds_the_candidate_cap_and_items_are_named_as_prefixes():
    """top_k is bounded by max_candidates (the next round's domain grows with every item kept), and a heavy-hitter
    round's items are named as prefixes even when the stream's category count happens to equal its k."""
    from coordinator.estimate import _frequency_labels

    hh = HeavyHitterSpec(bits=16, prefix_bits=0, step_bits=8, candidates=[0], threshold=0.0, top_k=1000)
    f = np.full(hh.k, 1.0 / hh.k)
    assert select_heavy_hitters(hh, f, np.zeros(hh.k), max_candidates=16).size == 16
    small = HeavyHitterSpec(bits=3, prefix_bits=1, step_bits=1, candidates=[0, 1])
    spec = StreamSpec.model_validate({"kind": "frequency", "mechanism": "oue",
                                      "params": {"epsilon": 1.0, "k": small.k}, "dims": ["site"],
                                      "labels": ["a", "b", "c", "d", "e"][: small.k],
                                      "heavy_hitters": small.model_dump()})
    names = _frequency_labels(spec, small.k)
    assert names[-1] == "other" and names[:-1] != ["a", "b", "c", "d", "e"][: small.k - 1]


# --- one prefix encoding ---------------------------------------------------------------------------------------------
# The two encodings as they were before protocols.heavy_hitters.prefix_items became their one home: the reference.

def _old_contract_items(spec: HeavyHitterSpec, values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.int64)
    prefix = v >> (spec.bits - spec.prefix_bits)
    nxt = (v >> (spec.bits - spec.prefix_bits - spec.step_bits)) & ((1 << spec.step_bits) - 1)
    cands = np.asarray(spec.candidates, dtype=np.int64)
    order = np.argsort(cands)
    sorted_c = cands[order]
    pos = np.clip(np.searchsorted(sorted_c, prefix), 0, len(sorted_c) - 1)
    found = sorted_c[pos] == prefix
    idx = order[pos]
    return np.where(found, idx * (1 << spec.step_bits) + nxt, spec.k - 1).astype(np.int64)


def _old_index(prefix: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The old ``PrefixExtensionHeavyHitters.encode`` once the round's prefix length is applied."""
    order = np.argsort(candidates, kind="stable")
    pos = np.minimum(np.searchsorted(candidates[order], prefix), candidates.size - 1)
    found = candidates[order][pos] == prefix
    return np.where(found, order[pos], candidates.size)


def _prefix_lists(width: int) -> list[list[int]]:
    """Every set of ``width``-bit prefixes (ascending, the empty one too) and every ordering of two or three."""
    every = range(1 << width)
    sets = [list(c) for n in range(len(every) + 1) for c in itertools.combinations(every, n)]
    return sets + [list(p) for n in (2, 3) for p in itertools.permutations(every, n)]


def test_the_contract_items_are_unchanged_and_are_the_simulations_candidate_indices():
    """heavy_hitter_items gives what it gave before, on every round over values of up to 5 bits whose candidates
    are at most 3 bits wide: item = the index of the value's prefix among the extended candidates, or their count."""
    for bits in range(1, 6):
        values = np.arange(1 << bits)
        for prefix_bits in range(min(bits, 4)):
            for step_bits in range(1, bits - prefix_bits + 1):
                for cands in filter(None, _prefix_lists(prefix_bits)):
                    spec = HeavyHitterSpec(bits=bits, prefix_bits=prefix_bits, step_bits=step_bits, candidates=cands)
                    items = heavy_hitter_items(spec, values)
                    assert items.dtype == np.int64
                    np.testing.assert_array_equal(items, _old_contract_items(spec, values))
                    extended = extend_prefixes(cands, step_bits)
                    assert extended.size == spec.k - 1
                    np.testing.assert_array_equal(items, _old_index(values >> (bits - prefix_bits - step_bits),
                                                                    extended))


def test_the_simulations_encoding_is_unchanged():
    """PrefixExtensionHeavyHitters.candidates and .encode give what they gave before, on every round over values of up
    to 5 bits whose kept prefixes are at most 3 bits wide (values outside [0, 2^bits) too: "not a candidate")."""
    for bits in range(1, 6):
        values = np.arange(-(1 << bits), 2 << bits)
        for start_bits, step_bits in itertools.product(range(1, bits + 1), repeat=2):
            protocol = PrefixExtensionHeavyHitters(1.0, bits, start_bits, step_bits)
            lengths = protocol.prefix_lengths
            for r in range(protocol.rounds):
                if r and lengths[r - 1] > 3:
                    continue
                for kept in [None] if r == 0 else [np.array(k, dtype=np.int64) for k in _prefix_lists(lengths[r - 1])]:
                    cands = protocol.candidates(r, kept)
                    grow = lengths[r] - (lengths[r - 1] if r else 0)
                    old = np.arange(1 << start_bits) if r == 0 else (
                        (kept[:, None] << grow) | np.arange(1 << grow)[None, :]).ravel()
                    np.testing.assert_array_equal(cands, old)
                    if cands.size:
                        np.testing.assert_array_equal(protocol.encode(values, r, cands),
                                                      _old_index(values >> (bits - lengths[r]), cands))
    with pytest.raises(ValueError, match="candidate list"):
        PrefixExtensionHeavyHitters(1.0, 4, 2, 2).encode(np.arange(16), 1, np.array([4, 5, 6]))
