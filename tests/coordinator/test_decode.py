"""Stored report bodies are decoded into one array (coordinator/decode.py): canonical bodies by one parse, without a
per-report Python loop, matching row-by-row decoding; other bodies row by row, the broken ones dropped and counted."""

from __future__ import annotations

import numpy as np
import pytest

from protocols import catalogue, wire
from tests.coordinator.support_rows import SUPPORT_STREAMS


def _bodies_and_rows(name, n, rng):
    from protocols.contract import StreamSpec

    spec = StreamSpec.model_validate(SUPPORT_STREAMS[name])
    mech = spec.build()
    if spec.kind == "longitudinal":
        rows = [mech.client(secret=bytes(32), stream=f"s{i}", rng=rng).report(int(rng.integers(4))).report
                for i in range(n)]
        rows = [np.asarray(r).tolist() for r in rows]
    elif spec.kind == "frequency":
        rows = mech.privatize(rng.integers(0, 4, n), rng).tolist()
    elif spec.kind == "haar":
        rows = [catalogue.entry("haar").encode_row(mech, r) for r in mech.privatize(rng.uniform(-1, 1, (n, 3)), rng)]
    else:
        d = len(spec.dims)
        rows = mech.privatize(rng.uniform(-1, 1, (n, d)) if d > 1 else rng.uniform(-1, 1, n), rng).tolist()
    return spec, [wire.canonical_json({"report": r}).decode() for r in rows], rows


@pytest.mark.parametrize("name", list(SUPPORT_STREAMS))
def test_bodies_are_stacked_by_one_parse_and_match_row_by_row_decoding(monkeypatch, name):
    from coordinator.decode import StreamDecoder

    spec, bodies, rows = _bodies_and_rows(name, 50, np.random.default_rng(8))
    dec = StreamDecoder.for_spec(spec)
    expected = np.stack([dec.row(r) for r in rows])

    def no_loop(*_a, **_k):
        raise AssertionError("per-row fallback used for canonical bodies")

    with monkeypatch.context() as m:
        m.setattr(StreamDecoder, "_slow_stack", no_loop)
        m.setattr("coordinator.decode._body_rows", no_loop)
        fast = dec.from_bodies(bodies)
        listed = dec.stack(rows)
    np.testing.assert_array_equal(fast.reports, expected)
    np.testing.assert_array_equal(listed.reports, expected)
    assert fast.dropped == 0 and fast.reports.dtype == expected.dtype
    # non-canonical (spaces, key order) and broken bodies: row by row, the broken ones dropped and counted
    odd = [b.replace(":", ": ") for b in bodies[:3]] + ["{", '{"report":"x"}'] + bodies[3:]
    slow = dec.from_bodies(odd)
    np.testing.assert_array_equal(slow.reports, expected)
    assert slow.dropped == 2
