"""The mechanism catalogue (protocols/catalogue.py): each mechanism declared once, its declared row shape and codec
true to what the mechanism actually reports, the front door, and no second table of names elsewhere."""

from __future__ import annotations

import ast
import json
import inspect
import os
from pathlib import Path

import numpy as np
import pytest

import protocols
from protocols import catalogue
from protocols.catalogue import Family, Role
from protocols.longitudinal.base import LongitudinalProtocol

ROOT = Path(__file__).resolve().parents[2]


def _params(e: catalogue.Entry) -> dict:
    """Small valid constructor parameters for every stream mechanism."""
    if e.family is Family.LONGITUDINAL:
        return {"ddrm": {"epsilon_inf": 1.0, "k": 4, "horizon": 8, "changes": 1}}.get(
            e.name, {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4})
    if e.family is Family.DISTRIBUTION:
        return {"epsilon": 0.5, "D": 8}
    sig = inspect.signature(e.cls)
    p: dict = {"epsilon": 0.5}
    if "k" in sig.parameters:
        p["k"] = 5
    if "d" in sig.parameters:
        p["d"] = 3
    if "delta" in sig.parameters:
        p["delta"] = 1e-6
    return p


def _rows(e: catalogue.Entry, mech, n: int, rng: np.random.Generator) -> np.ndarray:
    """n reports made the way a device makes them."""
    if e.family is Family.LONGITUDINAL:
        return np.stack([np.asarray(mech.client(secret=os.urandom(32), stream=f"s{i}", rng=rng)
                                    .report(int(rng.integers(4))).report) for i in range(n)])
    if e.family is Family.FREQUENCY:
        return np.asarray(mech.privatize(rng.integers(0, mech.k, n), rng))
    if e.family is Family.DISTRIBUTION:
        return np.asarray(mech.privatize_unit(rng.uniform(0, 1, n), rng))
    x = rng.uniform(-1, 1, (n, mech.d)) if hasattr(mech, "d") else rng.uniform(-1, 1, n)
    return np.asarray(mech.privatize(x, rng))


STREAMS = catalogue.names(Role.STREAM)


@pytest.mark.parametrize("name", STREAMS)
def test_declared_row_shape_and_codec_are_what_the_mechanism_reports(name, rng):
    e = catalogue.entry(name)
    mech = e.build(**_params(e))
    rows = _rows(e, mech, 7, rng)
    assert rows.shape[1:] == e.row_shape(mech)
    assert (rows.dtype.kind in "iu") == e.integer
    encoded = [e.encode_row(mech, r) for r in rows]
    np.testing.assert_array_equal(e.decode_rows(mech, encoded), rows)
    assert e.decode_rows(mech, encoded).dtype == (np.int64 if e.integer else np.float64)
    with pytest.raises(ValueError):
        e.encode_row(mech, np.zeros((*e.row_shape(mech), 2)))


def test_every_named_longitudinal_protocol_is_catalogued_and_rebuilt_from_its_name():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    named = {c for c in subclasses(LongitudinalProtocol) if "name" in c.__dict__}
    assert named == {e.cls for e in catalogue.CATALOGUE if e.family is Family.LONGITUDINAL}
    for cls in named:
        assert catalogue.protocol_entry(cls.name).cls is cls
    with pytest.raises(ValueError, match="unknown longitudinal protocol"):
        catalogue.protocol_entry("L-NOPE")


def test_names_are_unique_and_roles_fit_families():
    names = [e.name for e in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for role, families in {Role.SCALAR: {Family.NUMERIC}, Role.KSAMPLING_BASE: {Family.NUMERIC},
                           Role.HAAR_MEAN: {Family.NUMERIC}, Role.HAAR_DETAIL: {Family.VECTOR},
                           Role.CHANGE_BOUNDED: {Family.LONGITUDINAL}}.items():
        assert {catalogue.entry(n).family for n in catalogue.names(role)} <= families
    assert set(catalogue.names(Role.HAAR_MEAN_AUTO)) < set(catalogue.names(Role.HAAR_MEAN))
    assert set(catalogue.names(Role.KSAMPLING_BASE)) <= set(catalogue.names(Role.SCALAR))
    with pytest.raises(ValueError, match="unknown mechanism 'gpm'"):
        catalogue.entry("gpm")
    with pytest.raises(ValueError, match="bad parameters"):
        catalogue.build("oue", epsilon=1.0)


def test_front_door_exports_every_class_and_build(rng):
    for e in catalogue.CATALOGUE:
        cls_name = e.target.partition(":")[2]
        assert cls_name in protocols.__all__ and getattr(protocols, cls_name) is e.cls
    mech = protocols.build("oue", epsilon=1.0, k=10)
    assert isinstance(mech, protocols.OUE)
    est = mech.estimate(mech.privatize(rng.integers(0, 10, 2000), rng))
    assert est.shape == (10,) and abs(est.sum() - 1) < 0.5
    with pytest.raises(AttributeError):
        protocols.NoSuchMechanism  # noqa: B018


#: Literals naming several mechanisms that are not tables of mechanisms: RDP curve kinds (accounting) and the
#: columns of the auto choice's comparison table.
_NOT_NAME_TABLES = {("protocols/accounting.py", ("gaussian", "grr")),
                    ("protocols/pipeline/auto.py", ("duchi_md", "haar", "ksampling"))}


def test_no_second_table_of_mechanism_names():
    """Outside the catalogue no tuple, list, set or dict literal lists two or more mechanism names."""
    known = {e.name for e in catalogue.CATALOGUE}
    found = set()
    for pkg in ("protocols", "edge_agent", "coordinator", "simulations"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "catalogue.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                elts = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                        else [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else [])
                names = {x.value for x in elts if isinstance(x, ast.Constant) and x.value in known}
                if len(names) >= 2:
                    found.add((path.relative_to(ROOT).as_posix(), tuple(sorted(names))))
    assert found <= _NOT_NAME_TABLES, sorted(found - _NOT_NAME_TABLES)


@pytest.mark.parametrize("name", STREAMS)
def test_sufficient_statistics_add_and_give_the_mechanisms_own_estimate(name, rng):
    """Statistics of disjoint parts add up to those of the whole, survive JSON, and estimate exactly what the
    mechanism estimates from the rows."""
    e = catalogue.entry(name)
    mech = e.build(**_params(e))
    rows = _rows(e, mech, 60, rng)
    parts = e.statistics(mech, rows[:25]) + e.statistics(mech, rows[:0]) + e.statistics(mech, rows[25:])
    whole = e.statistics(mech, rows)
    assert parts.n == whole.n == 60 and parts.close_to(whole)
    again = catalogue.Statistics.from_json(json.loads(json.dumps(whole.to_json())))
    np.testing.assert_array_equal(again.total, whole.total)
    direct = mech.estimate_round(rows) if e.family is Family.LONGITUDINAL else mech.estimate(rows)
    np.testing.assert_allclose(e.estimate(mech, parts), np.asarray(direct, dtype=float).reshape(-1),
                               rtol=1e-12, atol=1e-12)
    if e.family in (Family.NUMERIC, Family.VECTOR, Family.HAAR):
        y = np.asarray(mech.debias(rows), dtype=float).reshape(60, -1)
        np.testing.assert_allclose(whole.squares, (y**2).sum(axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="zero reports"):
        e.estimate(mech, e.statistics(mech, rows[:0]))


ONE_USER = [n for n in STREAMS if catalogue.entry(n).family not in (Family.LONGITUDINAL, Family.DISTRIBUTION)]


def _one_value(e: catalogue.Entry, mech, rng: np.random.Generator):
    if e.family is Family.FREQUENCY:
        return int(rng.integers(0, mech.k))
    return rng.uniform(-1, 1, mech.d) if hasattr(mech, "d") else float(rng.choice([-1.0, 1.0, rng.uniform(-1, 1)]))


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("name", ONE_USER)
def test_privatize_one_is_the_batch_of_one_with_the_same_draws(name, epsilon):
    """A device's one-user path (``Mechanism.privatize_one``) IS ``privatize([v])[0]``: on a shared seed it returns
    the same row and leaves the generator in the same state (its whole ``bit_generator.state``), for 300 values per mechanism (Hybrid at ε = 0.5 is
    pure Duchi, above ε* it mixes in PM), so every exact likelihood ratio and audit of ``privatize`` covers it."""
    e = catalogue.entry(name)
    try:
        mech = e.build(**{**_params(e), "epsilon": epsilon})
    except ValueError:  # the classic Gaussian calibration exists for ε < 1 only
        mech = e.build(**{**_params(e), "epsilon": epsilon / 5})
    values = np.random.default_rng(7)
    for seed in range(300):
        v = _one_value(e, mech, values)
        one, batch = np.random.default_rng(seed), np.random.default_rng(seed)
        row = mech.privatize_one(v, one)
        expected = np.asarray(mech.privatize(np.asarray(v)[None], batch))[0]
        np.testing.assert_array_equal(np.asarray(row), expected)
        assert json.dumps(e.encode_row(mech, row)) == json.dumps(e.encode_row(mech, expected))
        assert one.bit_generator.state == batch.bit_generator.state  # the same draws, buffered bits included


@pytest.mark.parametrize("name", [n for n in ONE_USER if catalogue.entry(n).family is not Family.VECTOR
                                  and catalogue.entry(n).family is not Family.HAAR])
def test_privatize_one_rejects_what_privatize_rejects(name, rng):
    e = catalogue.entry(name)
    mech = e.build(**_params(e))
    bad = ([-1, 5, 2.5, float("nan"), "x", True] if e.family is Family.FREQUENCY
           else [1.5, -1.0000001, float("nan"), float("inf")])
    for v in bad:
        with pytest.raises(ValueError):
            mech.privatize(np.asarray([v]), rng)
        with pytest.raises(ValueError):
            mech.privatize_one(v, rng)
    if e.family is Family.FREQUENCY:
        assert np.asarray(mech.privatize_one(4.0, rng)).shape == e.row_shape(mech)  # an integral float is a category
