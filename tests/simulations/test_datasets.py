"""simulations.datasets: Adult loading and validation, Syn, the Adult+Syn combination, the Gaussian synthetic."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simulations.datasets import (
    ADULT_ENV,
    Attribute,
    Dataset,
    DatasetError,
    Domain,
    adult_dir,
    adult_with_syn,
    gaussian_dataset,
    generate_syn,
    load_adult,
    normalise_codes,
    parse_domain,
    syn_as_numeric,
)

ADULT_AVAILABLE = (adult_dir() / "adult-coarse.dat").is_file()
needs_adult = pytest.mark.skipif(not ADULT_AVAILABLE, reason="data/adult not present")


def _write_dataset(root: Path, rows: list[list[int]], domain_lines: list[str], header_rows: int | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    n = len(rows) if header_rows is None else header_rows
    (root / "adult-coarse.dat").write_text(f"{n}\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    (root / "adult-coarse.domain").write_text(f"{len(domain_lines)} {n}\n" + "\n".join(domain_lines) + "\n")


TINY_DOMAIN = ["A C 3 0 1 2", "B D 2 0 1"]


@needs_adult
def test_adult_shape_and_domain():
    adult = load_adult()
    assert adult.data.shape == (45_222, 15)
    assert adult.domain.numeric_columns == [0, 2, 4, 10, 11, 12]
    assert len(adult.domain.categorical_columns) == 9
    assert adult.domain.sizes.tolist()[:4] == [16, 7, 16, 16]
    assert np.all(adult.data.min(axis=0) >= 0) and np.all(adult.data.max(axis=0) < adult.domain.sizes)
    x = adult.normalised()
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert np.isclose(adult.marginal(1).sum(), 1.0)


def test_env_override_loads_the_named_directory(tmp_path, monkeypatch):
    _write_dataset(tmp_path / "adult", [[0, 1], [2, 0], [1, 1]], TINY_DOMAIN)
    monkeypatch.setenv(ADULT_ENV, str(tmp_path / "adult"))
    ds = load_adult()
    assert ds.data.tolist() == [[0, 1], [2, 0], [1, 1]]
    assert ds.domain == Domain((Attribute("A", "C", 3), Attribute("B", "D", 2)))
    assert ds.normalised()[:, 0].tolist() == [-1.0, 1.0, 0.0]


def test_missing_directory_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(ADULT_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DatasetError, match=ADULT_ENV):
        load_adult()


@pytest.mark.parametrize(
    "rows, domain, header, message",
    [
        ([[0, 1], [3, 0]], TINY_DOMAIN, None, "outside"),  # value beyond the declared size
        ([[0, 1], [1, 0]], TINY_DOMAIN, 3, "header says 3 rows"),
        ([[0, 1, 0], [1, 0, 1]], TINY_DOMAIN, None, "shape"),
        ([[0, 1]], ["A C 3 0 1 5", "B D 2 0 1"], None, "codes 0..2"),
        ([[0, 1]], ["A X 3 0 1 2", "B D 2 0 1"], None, "kind"),
    ],
)
def test_malformed_files_are_rejected(tmp_path, rows, domain, header, message):
    _write_dataset(tmp_path, rows, domain, header)
    with pytest.raises(DatasetError, match=message):
        load_adult(tmp_path)


def test_parse_domain_header_must_match():
    with pytest.raises(DatasetError, match="declares 3 attributes"):
        parse_domain("3 10\nA C 2 0 1\n")


def test_normalise_codes_endpoints_and_validation():
    assert normalise_codes(np.array([[0, 0], [15, 6]]), np.array([16, 7])).tolist() == [[-1, -1], [1, 1]]
    with pytest.raises(ValueError):
        normalise_codes(np.array([[16]]), np.array([16]))


def test_dataset_validates_codes():
    with pytest.raises(DatasetError, match="outside"):
        Dataset("x", np.array([[0], [2]]), Domain((Attribute("A", "D", 2),)))
    with pytest.raises(DatasetError, match="integer"):
        Dataset("x", np.array([[0.5]]), Domain((Attribute("A", "D", 2),)))
    with pytest.raises(ValueError):
        Attribute("A", "D", 1)


def test_syn_shape_range_reproducibility_and_change_rate():
    a = generate_syn(np.random.default_rng(7))
    b = generate_syn(np.random.default_rng(7))
    assert a.shape == (10_000, 120) and a.dtype == np.int64
    assert np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < 360
    rate = float(np.mean(a[:, 1:] != a[:, :-1]))
    expected = 0.25 * (1 - 1 / 360)  # a redraw may land on the same value
    se = math.sqrt(expected * (1 - expected) / a[:, 1:].size)
    assert abs(rate - expected) < 6 * se
    first = np.bincount(a[:, 0], minlength=360)
    assert first.min() > 0  # uniform start covers the domain at n = 10^4 (expected 27.8 per value)
    with pytest.raises(ValueError):
        generate_syn(np.random.default_rng(0), change_probability=1.5)


def test_adult_with_syn_maps_row_i_to_user_i_mod_n():
    static = Dataset("S", np.zeros((25, 1), dtype=np.int64), Domain((Attribute("A", "D", 2),)))
    syn = generate_syn(np.random.default_rng(3), n=10, tau=4, k=360)
    combined = adult_with_syn(static, syn)
    assert combined.series.shape == (25, 4)
    assert np.array_equal(combined.series[13], syn[3])
    at2 = combined.at_round(2)
    assert at2.d == 2 and at2.domain.names == ["A", "Syn"]
    assert np.array_equal(at2.data[:, 1], syn[np.arange(25) % 10, 2])
    with pytest.raises(ValueError):
        combined.at_round(4)
    rec = combined.records(1, 3, rows=12)
    assert rec.shape == (12, 2, 2)
    assert np.array_equal(rec[:, :, 1], syn[np.arange(12) % 10, 1:3]) and np.all(rec[:, :, 0] == 0)
    with pytest.raises(ValueError):
        combined.records(3, 3)


def test_syn_as_numeric_and_gaussian():
    syn = generate_syn(np.random.default_rng(4), n=50, tau=20)
    ds = syn_as_numeric(syn, 16)
    assert ds.data.shape == (50, 16) and ds.domain.sizes.tolist() == [360] * 16
    g1 = gaussian_dataset(np.random.default_rng(5), 4000, 15)
    g2 = gaussian_dataset(np.random.default_rng(5), 4000, 15)
    assert np.array_equal(g1.data, g2.data) and g1.data.shape == (4000, 15)
    means = g1.true_means()
    assert means[0] < means[-1]  # means spread over [-0.5, 0.5]
    assert abs(means[0] + 0.5) < 0.05 and abs(means[-1] - 0.5) < 0.05
