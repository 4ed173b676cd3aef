"""Datasets of the evaluation (SPEC §6, thesis chapter 5): Adult, Syn, their combination, a Gaussian synthetic.

* **Adult** (coarse integer form, 45,222 rows × 15 attributes) is read from ``data/adult/`` (shipped; see its README) relative to
  the repository root, or from the directory named by the environment variable ``HAARVEST_ADULT_DIR``. The ``.dat``
  file holds a row count and then comma-separated rows; the ``.domain`` file holds ``<attributes> <rows>`` and then
  one line per attribute ``name kind size v_0 … v_{size-1}`` (kind ``C``: ordered/numeric, ``D``: categorical).
  Shapes and every value are validated against the domain.
* **Syn** (thesis §5; generator :mod:`simulations.syn`): n = 10,000 users, τ = 120 collection times, k = 360
  values; the first value is uniform on [0, k); at each later time the value is redrawn uniformly on [0, k) with
  probability 0.25 (it may redraw the same value) and kept otherwise. Always from an explicitly seeded generator.
* **Adult + Syn** (the thesis's combination): Syn appended to Adult as a 16th, evolving column — row i gets the series
  of Syn user ``i mod n_syn``.
* **Gaussian** synthetic: correlated Gaussian vectors, discretised to an integer domain (a smooth, unimodal contrast
  to Adult's skewed columns).

Numeric use: a column with integer domain [0, size-1] is normalised to ``t = 2v/(size-1) - 1`` ∈ [-1, 1]
(SPEC §2.3 with lo = 0, hi = size - 1).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from protocols.base import check_int
from simulations import syn

from protocols.errors import DatasetError

__all__ = [
    "ADULT_ENV",
    "ADULT_FILES",
    "Attribute",
    "Domain",
    "Dataset",
    "EvolvingDataset",
    "DatasetError",
    "parse_domain",
    "read_dat",
    "adult_dir",
    "load_adult",
    "adult_codebook",
    "bin_midpoints",
    "SYN_N",
    "SYN_TAU",
    "SYN_K",
    "SYN_CHANGE_PROBABILITY",
    "generate_syn",
    "syn_attribute",
    "adult_with_syn",
    "syn_as_numeric",
    "gaussian_dataset",
    "normalise_codes",
]

#: Environment variable that overrides the Adult directory.
ADULT_ENV = "HAARVEST_ADULT_DIR"
#: File names inside the Adult directory.
ADULT_FILES = ("adult-coarse.dat", "adult-coarse.domain")

SYN_N = 10_000
SYN_TAU = 120
SYN_K = 360
SYN_CHANGE_PROBABILITY = 0.25

Kind = Literal["C", "D"]


@dataclass(frozen=True)
class Attribute:
    """One column: ``name``, ``kind`` (``"C"`` ordered/numeric, ``"D"`` categorical) and domain ``size``.

    Values are the integer codes ``0 … size-1``.
    """

    name: str
    kind: Kind
    size: int

    def __post_init__(self) -> None:
        if not self.name or any(ch.isspace() for ch in self.name):
            raise ValueError(f"attribute name must be a non-empty word, got {self.name!r}")
        if self.kind not in ("C", "D"):
            raise ValueError(f"attribute {self.name}: kind must be 'C' or 'D', got {self.kind!r}")
        check_int(self.size, f"attribute {self.name} size", minimum=2)

    @property
    def numeric(self) -> bool:
        return self.kind == "C"


@dataclass(frozen=True)
class Domain:
    """The attributes of a dataset, in column order."""

    attributes: tuple[Attribute, ...]

    def __post_init__(self) -> None:
        if not self.attributes:
            raise ValueError("a domain needs at least one attribute")
        names = [a.name for a in self.attributes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate attribute names in domain: {names}")

    @property
    def d(self) -> int:
        return len(self.attributes)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.attributes]

    @property
    def sizes(self) -> np.ndarray:
        return np.array([a.size for a in self.attributes], dtype=np.int64)

    @property
    def numeric_columns(self) -> list[int]:
        return [j for j, a in enumerate(self.attributes) if a.numeric]

    @property
    def categorical_columns(self) -> list[int]:
        return [j for j, a in enumerate(self.attributes) if not a.numeric]

    def subset(self, columns: Sequence[int]) -> Domain:
        return Domain(tuple(self.attributes[j] for j in columns))


def normalise_codes(codes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``t = 2v/(size-1) - 1``: integer codes in [0, size-1] (per column) to [-1, 1]."""
    codes = np.asarray(codes)
    sizes = np.asarray(sizes)
    if codes.size and (np.any(codes < 0) or np.any(codes >= sizes)):
        raise ValueError("codes must lie in [0, size-1] of their column")
    return 2.0 * codes / (sizes - 1) - 1.0


@dataclass(frozen=True)
class Dataset:
    """A static dataset: ``data`` is an ``(n, d)`` int64 array of codes, column j in ``[0, domain.sizes[j])``."""

    name: str
    data: np.ndarray
    domain: Domain

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        if data.ndim != 2 or data.shape[1] != self.domain.d or data.shape[0] == 0:
            raise DatasetError(f"{self.name}: data must have shape (n >= 1, {self.domain.d}), got {data.shape}")
        if not np.issubdtype(data.dtype, np.integer):
            raise DatasetError(f"{self.name}: data must be integer codes, got dtype {data.dtype}")
        bad = np.flatnonzero((data.min(axis=0) < 0) | (data.max(axis=0) >= self.domain.sizes))
        if bad.size:
            j = int(bad[0])
            raise DatasetError(
                f"{self.name}: column {self.domain.names[j]} has values outside [0, {self.domain.sizes[j] - 1}]"
            )

    @property
    def n(self) -> int:
        return int(self.data.shape[0])

    @property
    def d(self) -> int:
        return self.domain.d

    def normalised(self) -> np.ndarray:
        """``(n, d)`` floats in [-1, 1] (every column treated as ordered: :func:`normalise_codes`)."""
        return normalise_codes(self.data, self.domain.sizes)

    def true_means(self) -> np.ndarray:
        """Column means of :meth:`normalised`, shape (d,)."""
        return self.normalised().mean(axis=0)

    def marginal(self, column: int) -> np.ndarray:
        """Empirical distribution of one column over its domain (fractions, sums to 1)."""
        size = int(self.domain.sizes[column])
        return np.bincount(self.data[:, column], minlength=size) / self.n

    def columns(self, columns: Sequence[int], name: str | None = None) -> Dataset:
        cols = list(columns)
        if not cols:
            raise ValueError("select at least one column")
        return Dataset(name or self.name, self.data[:, cols], self.domain.subset(cols))


@dataclass(frozen=True)
class EvolvingDataset:
    """A static dataset plus one evolving column observed at τ times: ``series`` has shape (n, τ)."""

    static: Dataset
    series: np.ndarray
    attribute: Attribute

    def __post_init__(self) -> None:
        s = np.asarray(self.series)
        if s.ndim != 2 or s.shape[0] != self.static.n or s.shape[1] == 0:
            raise DatasetError(f"series must have shape ({self.static.n}, tau >= 1), got {s.shape}")
        if s.min() < 0 or s.max() >= self.attribute.size:
            raise DatasetError(f"series values must lie in [0, {self.attribute.size - 1}]")

    @property
    def tau(self) -> int:
        return int(self.series.shape[1])

    @property
    def domain(self) -> Domain:
        """The static attributes followed by the evolving one."""
        return Domain((*self.static.domain.attributes, self.attribute))

    def records(self, start: int = 0, stop: int | None = None, rows: int | None = None) -> np.ndarray:
        """Float codes of shape (rows, stop - start, d + 1): the static columns repeated over the rounds, then the
        evolving column (bounds per column: 0 and size - 1, see :meth:`Domain.sizes`)."""
        stop = self.tau if stop is None else stop
        if not 0 <= start < stop <= self.tau:
            raise ValueError(f"need 0 <= start < stop <= {self.tau}, got start={start}, stop={stop}")
        n = self.static.n if rows is None else check_int(rows, "rows", minimum=1, maximum=self.static.n)
        tau = stop - start
        out = np.empty((n, tau, self.static.d + 1))
        out[:, :, :-1] = self.static.data[:n, None, :]
        out[:, :, -1] = self.series[:n, start:stop]
        return out

    def at_round(self, t: int) -> Dataset:
        """The static columns plus the evolving column's value at time t, as a (d+1)-column dataset."""
        t = check_int(t, "t", minimum=0, maximum=self.tau - 1)
        data = np.column_stack([self.static.data, self.series[:, t]])
        return Dataset(f"{self.static.name}@t={t}", data, self.domain)


# ------------------------------------------------------------------------------------------------------------ Adult


def parse_domain(text: str) -> tuple[Domain, int]:
    """Parse a ``.domain`` file: returns the domain and the declared row count.

    Format: first line ``<attributes> <rows>``; then per attribute ``name kind size v_0 … v_{size-1}`` with the
    values exactly the codes 0..size-1.
    """
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines[0]) != 2:
        raise DatasetError("domain file: first line must be '<attributes> <rows>'")
    try:
        n_attr, n_rows = int(lines[0][0]), int(lines[0][1])
    except ValueError:
        raise DatasetError(f"domain file: bad header {' '.join(lines[0])!r}") from None
    if len(lines) - 1 != n_attr:
        raise DatasetError(f"domain file declares {n_attr} attributes but lists {len(lines) - 1}")
    attrs = []
    for fields in lines[1:]:
        if len(fields) < 3:
            raise DatasetError(f"domain file: attribute line too short: {' '.join(fields)!r}")
        name, kind, size_text, *values = fields
        try:
            size = int(size_text)
            codes = [int(v) for v in values]
        except ValueError:
            raise DatasetError(f"domain file: attribute {name}: non-integer size or values") from None
        if codes != list(range(size)):
            raise DatasetError(f"domain file: attribute {name}: values must be the codes 0..{size - 1}")
        try:
            attrs.append(Attribute(name, kind, size))  # type: ignore[arg-type]
        except ValueError as exc:
            raise DatasetError(f"domain file: {exc}") from None
    return Domain(tuple(attrs)), n_rows


def read_dat(path: Path) -> np.ndarray:
    """Read a ``.dat`` file (first line: row count; then comma-separated integer rows) into an int64 array."""
    with open(path, encoding="ascii") as fh:
        header = fh.readline().strip()
        try:
            n_rows = int(header)
        except ValueError:
            raise DatasetError(f"{path}: first line must be the row count, got {header!r}") from None
        try:
            data = np.loadtxt(fh, delimiter=",", dtype=np.int64, ndmin=2)
        except ValueError as exc:
            raise DatasetError(f"{path}: malformed row ({exc})") from None
    if data.shape[0] != n_rows:
        raise DatasetError(f"{path}: header says {n_rows} rows, file has {data.shape[0]}")
    return data


#: the Adult files shipped with the repository (data/adult: the data, its provenance and licence)
ADULT_DIR = Path(__file__).resolve().parents[1] / "data" / "adult"


def adult_dir() -> Path:
    """``$HAARVEST_ADULT_DIR`` if set, else ``<repo>/data/adult`` (shipped with the repository)."""
    override = os.environ.get(ADULT_ENV)
    if override:
        return Path(override)
    return ADULT_DIR


def load_adult(directory: Path | str | None = None) -> Dataset:
    """Load and validate Adult (coarse): 45,222 × 15 codes, checked against ``adult-coarse.domain``."""
    root = adult_dir() if directory is None else Path(directory)
    dat, dom = (root / f for f in ADULT_FILES)
    missing = [str(p) for p in (dat, dom) if not p.is_file()]
    if missing:
        raise DatasetError(
            f"Adult dataset not found: missing {', '.join(missing)}. Put adult-coarse.dat and adult-coarse.domain "
            f"in data/adult/ (relative to the repository root; shipped with it) or set {ADULT_ENV} to their directory."
        )
    domain, n_rows = parse_domain(dom.read_text(encoding="ascii"))
    data = read_dat(dat)
    if data.shape != (n_rows, domain.d):
        raise DatasetError(f"{dat}: shape {data.shape} does not match the domain's ({n_rows}, {domain.d})")
    return Dataset("Adult", data, domain)


def adult_codebook() -> dict[str, dict]:
    """What the coarse codes mean (``data/adult/codebook.json``, shipped; its README says how it was derived):
    ``{column name: {"column": index, "kind": "bins" | "labels", "bins": [[lo, hi], …] (integer values each code
    covers), "units", "labels"}}``. Always the shipped copy: the meaning belongs to the coding, not to a directory
    ``HAARVEST_ADULT_DIR`` names."""
    import json

    path = ADULT_DIR / "codebook.json"
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["columns"])
    except (OSError, ValueError, KeyError) as exc:
        raise DatasetError(f"{path}: cannot read the Adult codebook ({exc})") from None


def bin_midpoints(column: dict) -> np.ndarray:
    """The midpoint of each code's bin of a ``kind = "bins"`` codebook column (index = code)."""
    return np.array([(lo + hi) / 2.0 for lo, hi in column["bins"]], dtype=float)


# ------------------------------------------------------------------------------------------------------------ Syn


def generate_syn(
    rng: np.random.Generator,
    n: int = SYN_N,
    tau: int = SYN_TAU,
    k: int = SYN_K,
    change_probability: float = SYN_CHANGE_PROBABILITY,
) -> np.ndarray:
    """Syn series, shape (n, τ), values in [0, k), with the thesis's defaults (:func:`simulations.syn.generate_syn`)."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a seeded numpy.random.Generator")
    return syn.generate_syn(rng, n=n, tau=tau, k=k, change_prob=change_probability)


def syn_attribute(k: int = SYN_K) -> Attribute:
    """The evolving column's attribute (ordered, size k)."""
    return Attribute("Syn", "C", k)


def adult_with_syn(adult: Dataset, syn: np.ndarray, k: int = SYN_K) -> EvolvingDataset:
    """The thesis's combination: row i of Adult gets the Syn series of user ``i mod n_syn``."""
    syn = np.asarray(syn)
    if syn.ndim != 2 or syn.shape[0] == 0:
        raise ValueError(f"syn must have shape (n_syn, tau), got {syn.shape}")
    rows = np.arange(adult.n) % syn.shape[0]
    return EvolvingDataset(adult, syn[rows], syn_attribute(k))


def syn_as_numeric(syn: np.ndarray, d: int, k: int = SYN_K) -> Dataset:
    """Syn as a static numeric dataset: each user's values at the first d collection times are its d columns."""
    syn = np.asarray(syn)
    d = check_int(d, "d", minimum=1, maximum=syn.shape[1])
    domain = Domain(tuple(Attribute(f"Syn_t{t}", "C", k) for t in range(d)))
    return Dataset("Syn", syn[:, :d].astype(np.int64), domain)


def gaussian_dataset(
    rng: np.random.Generator, n: int, d: int, size: int = 16, correlation: float = 0.5, scale: float = 0.3
) -> Dataset:
    """Correlated Gaussian records discretised to codes in [0, size).

    Column j is ``N(μ_j, scale²)`` on the [-1, 1] scale with means μ_j evenly spread over [-0.5, 0.5] and pairwise
    correlation ``correlation`` (one shared factor), clipped to [-1, 1] and rounded to the nearest of ``size`` levels.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a seeded numpy.random.Generator")
    n, d, size = check_int(n, "n"), check_int(d, "d"), check_int(size, "size", minimum=2)
    if not 0.0 <= correlation < 1.0 or scale <= 0:
        raise ValueError("need 0 <= correlation < 1 and scale > 0")
    means = np.linspace(-0.5, 0.5, d) if d > 1 else np.zeros(1)
    shared = rng.standard_normal((n, 1))
    own = rng.standard_normal((n, d))
    z = np.sqrt(correlation) * shared + np.sqrt(1 - correlation) * own
    t = np.clip(means + scale * z, -1.0, 1.0)
    codes = np.rint((t + 1) * (size - 1) / 2).astype(np.int64)
    domain = Domain(tuple(Attribute(f"G{j + 1}", "C", size) for j in range(d)))
    return Dataset("Gaussian", codes, domain)
