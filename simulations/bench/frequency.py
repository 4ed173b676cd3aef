"""Benchmark section: haarvest's frequency oracles against multi-freq-ldpy and pure-ldp, in one run.

For GRR, OUE, OLH and Hadamard response at n = 10^5 users, k = 360 items, ε = 1 (Zipf(1.1) data, fixed seed):
client cost per report (µs), server decode time (reports → all k estimates), the decode speed-up of haarvest,
peak traced memory of the decode, and the accuracy of each implementation (n·MSE over the k items, raw and after
clip-and-normalise) so that speed is compared at equal accuracy.

The peer libraries privatize and aggregate one user at a time in Python, so they run on the first ``n_peer`` users
(10^4) and their decode time is extrapolated linearly to n (their aggregation is a per-report loop: O(n) exactly);
rows marked † are extrapolated. Their n·MSE is measured at n_peer (n·MSE is scale-free for unbiased estimators).
Timings are measurements on a shared 2-core machine, not test assertions.

A second table runs pure-ldp's own ``example.py`` scenario for Hadamard response (d = 8 items, n = 18,600, ε = 3,
20 runs; :func:`example_scenario`): the mean squared error of the rounded count estimates, haarvest vs pure-ldp's
HadamardResponse (its general block construction above ε = 1), and their ratio.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import random
import sys
import time
import tracemalloc
import types
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from protocols.frequency import BLH, GRR, OLH, OUE, SUE, HadamardResponse, PublicMatrixOracle, clip_normalise
from protocols.frequency.hadamard import _admissible_rows, _design_variance

K = 360
EPSILON = 1.0
SEED = 20261122


@dataclass
class Row:
    oracle: str
    implementation: str
    n_timed: int
    client_us: float
    decode_s: float  # at the full n (extrapolated for peers run at n_peer)
    extrapolated: bool
    peak_mib: float | None
    nmse: float
    nmse_clipped: float


@dataclass
class Impl:
    """One implementation: privatize a batch of values into reports, decode reports into k fractions."""

    oracle: str
    name: str
    client: Callable[[np.ndarray], Any]
    decode: Callable[[Any, int], np.ndarray]
    vectorised: bool


# --- peers -------------------------------------------------------------------------------------------------------


def _pure_ldp(submodule: str, package: str = "frequency_oracles") -> types.ModuleType:
    """Import ``pure_ldp.<package>.<submodule>`` without the package ``__init__``.

    pure-ldp 1.2.0's ``frequency_oracles/__init__.py`` imports its RAPPOR server, which needs scikit-learn (not a
    declared dependency), and ``heavy_hitters/__init__.py`` imports its TreeHist server, which needs that
    ``__init__``; registering a bare package object lets the modules we benchmark import on their own.
    """
    name = f"pure_ldp.{package}.{submodule}"
    try:
        return importlib.import_module(name)
    except ImportError:
        spec = importlib.util.find_spec("pure_ldp")
        if spec is None or spec.origin is None:
            raise
        if package != "frequency_oracles":
            _pure_ldp("local_hashing")  # the heavy hitters' default oracle, through the bare frequency package
        bare = types.ModuleType(f"pure_ldp.{package}")
        bare.__path__ = [str(Path(spec.origin).parent / package)]
        sys.modules[f"pure_ldp.{package}"] = bare
        return importlib.import_module(name)


def _identity(x: Any) -> Any:
    return x


#: Set when the installed xxhash (≥ 4) rejects str input and the peers' local hashing had to be shimmed.
_XXHASH_SHIMMED: list[str] = []


def xxhash_str_compat(*modules: types.ModuleType) -> None:
    """Let the peers' local hashing run on xxhash ≥ 4, which no longer accepts ``str`` (both peers pass ``str(v)``).

    xxhash < 4 hashed a str as its UTF-8 bytes, so encoding first gives the same digests; the wrapper adds one Python
    call per hash to the peers' cost (pin ``xxhash<4`` to measure them unwrapped — the bench extra does).
    """
    import xxhash

    try:
        xxhash.xxh32("0", seed=0)
        return
    except TypeError:
        pass

    def xxh32(data: Any, seed: int = 0) -> Any:
        return xxhash.xxh32(data.encode("utf-8") if isinstance(data, str) else data, seed=seed)

    def xxh64(data: Any, seed: int = 0) -> Any:
        return xxhash.xxh64(data.encode("utf-8") if isinstance(data, str) else data, seed=seed)

    shim = types.SimpleNamespace(xxh32=xxh32, xxh64=xxh64)
    for module in modules:
        module.xxhash = shim  # type: ignore[attr-defined]
        _XXHASH_SHIMMED.append(module.__name__)


def pure_ldp_impls() -> list[Impl]:
    de = _pure_ldp("direct_encoding")
    ue = _pure_ldp("unary_encoding")
    lh = _pure_ldp("local_hashing")
    hr = _pure_ldp("hadamard_response")
    xxhash_str_compat(_pure_ldp("local_hashing.lh_client"), _pure_ldp("local_hashing.lh_server"))

    def server_decode(make_server: Callable[[], Any]) -> Callable[[Any, int], np.ndarray]:
        def decode(reports: list, n: int) -> np.ndarray:
            server = make_server()
            for report in reports:  # pure-ldp's server API aggregates one report at a time
                server.aggregate(report)
            return np.asarray(server.estimate_all(range(K), suppress_warnings=True), dtype=float) / n

        return decode

    def client_loop(client: Any) -> Callable[[np.ndarray], list]:
        return lambda values: [client.privatise(int(v)) for v in values]

    hr_server_proto = hr.HadamardResponseServer(EPSILON, K, index_mapper=_identity)
    hr_client = hr.HadamardResponseClient(EPSILON, K, hr_server_proto.get_hash_funcs(), index_mapper=_identity)
    return [
        Impl(
            "GRR",
            "pure-ldp DE",
            client_loop(de.DEClient(EPSILON, K, index_mapper=_identity)),
            server_decode(lambda: de.DEServer(EPSILON, K, index_mapper=_identity)),
            False,
        ),
        Impl(
            "OUE",
            "pure-ldp UE (use_oue)",
            client_loop(ue.UEClient(EPSILON, K, use_oue=True, index_mapper=_identity)),
            server_decode(lambda: ue.UEServer(EPSILON, K, use_oue=True, index_mapper=_identity)),
            False,
        ),
        Impl(
            "OLH",
            "pure-ldp LH (use_olh)",
            client_loop(lh.LHClient(EPSILON, K, use_olh=True, index_mapper=_identity)),
            server_decode(lambda: lh.LHServer(EPSILON, K, use_olh=True, index_mapper=_identity)),
            False,
        ),
        Impl(
            "HR",
            "pure-ldp HadamardResponse",
            client_loop(hr_client),
            server_decode(lambda: hr.HadamardResponseServer(EPSILON, K, index_mapper=_identity)),
            False,
        ),
    ]


def multi_freq_impls() -> list[Impl]:
    grr = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.GRR")
    ue = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.UE")
    lh = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.LH")
    xxhash_str_compat(lh)
    return [
        Impl(
            "GRR",
            "multi-freq-ldpy GRR",
            lambda v: [grr.GRR_Client(int(x), K, EPSILON) for x in v],
            lambda r, n: np.asarray(grr.GRR_Aggregator_MI(r, K, EPSILON), dtype=float),
            False,
        ),
        Impl(
            "OUE",
            "multi-freq-ldpy UE (optimal)",
            lambda v: [ue.UE_Client(int(x), K, EPSILON, True) for x in v],
            lambda r, n: np.asarray(ue.UE_Aggregator_MI(r, EPSILON, True), dtype=float),
            False,
        ),
        Impl(
            "OLH",
            "multi-freq-ldpy LH (optimal)",
            lambda v: [lh.LH_Client(int(x), K, EPSILON, True) for x in v],
            lambda r, n: np.asarray(lh.LH_Aggregator_MI(r, K, EPSILON, True), dtype=float),
            False,
        ),
    ]


# --- haarvest -----------------------------------------------------------------------------------------------------


def haarvest_impls(rng: np.random.Generator) -> list[Impl]:
    def impl(label: str, oracle: Any) -> Impl:
        return Impl(
            label,
            f"haarvest {type(oracle).__name__}",
            lambda v: oracle.privatize(v, rng),
            lambda r, n: oracle.estimate(r),
            True,
        )

    return [
        impl("GRR", GRR(EPSILON, K)),
        impl("OUE", OUE(EPSILON, K)),
        impl("OLH", OLH(EPSILON, K)),
        impl("HR", HadamardResponse(EPSILON, K)),
        impl("SUE", SUE(EPSILON, K)),
        impl("BLH", BLH(EPSILON, K)),
        impl("PublicMatrix", PublicMatrixOracle(EPSILON, K, key=b"bench")),
    ]


# --- measurement --------------------------------------------------------------------------------------------------


def _best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _peak_mib(fn: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _measure(impl: Impl, values: np.ndarray, n_peer: int, repeats: int) -> Row:
    """Time client and decode (haarvest at the full n, peers at n_peer, extrapolated); accuracy and peak memory on
    the first n_peer users for every implementation, so those columns compare equal inputs."""
    n_full = values.shape[0]
    subset = values[:n_peer]
    warm = impl.client(values[:50])  # one-time costs (imports, JIT, caches) stay out of the timings
    impl.decode(warm, 50)
    timed = values if impl.vectorised else subset
    client_s, reports = _best_time(lambda: impl.client(timed), repeats if impl.vectorised else 1)
    decode_s, estimate = _best_time(lambda: impl.decode(reports, timed.shape[0]), repeats if impl.vectorised else 1)
    if impl.vectorised:
        reports = impl.client(subset)
        estimate = impl.decode(reports, n_peer)
    peak = _peak_mib(lambda: impl.decode(reports, n_peer))
    estimate = np.asarray(estimate, dtype=float)
    truth = np.bincount(subset, minlength=K) / n_peer
    return Row(
        oracle=impl.oracle,
        implementation=impl.name,
        n_timed=timed.shape[0],
        client_us=client_s / timed.shape[0] * 1e6,
        decode_s=decode_s * n_full / timed.shape[0],
        extrapolated=timed.shape[0] != n_full,
        peak_mib=peak,
        nmse=float(n_peer * np.mean((estimate - truth) ** 2)),
        nmse_clipped=float(n_peer * np.mean((clip_normalise(estimate) - truth) ** 2)),
    )


def _analytic_nmse(label: str, truth: np.ndarray) -> float:
    oracle = {
        "GRR": GRR(EPSILON, K),
        "OUE": OUE(EPSILON, K),
        "OLH": OLH(EPSILON, K),
        "HR": HadamardResponse(EPSILON, K),
        "SUE": SUE(EPSILON, K),
        "BLH": BLH(EPSILON, K),
        "PublicMatrix": PublicMatrixOracle(EPSILON, K, key=b"x"),
    }[label]
    return float(np.mean(oracle.variance(truth)))


#: pure-ldp's ``example.py``: counts of items 1..8 (here 0..7), ε = 3; its error is the mean over the d items of the
#: squared error of the rounded count estimates.
EXAMPLE_COUNTS = (8000, 4000, 1000, 500, 1000, 1800, 2000, 300)
EXAMPLE_EPSILON = 3.0


def example_scenario(runs: int, seed: int = SEED) -> dict[str, Any]:
    """Hadamard response on pure-ldp's ``example.py`` data, haarvest vs pure-ldp, ``runs`` independent runs.

    Returns the per-run squared count errors of both (``None`` for pure-ldp when it is not installed), haarvest's
    construction (``rows``) and its analytic expectation ``Σ_v n·variance(f_v)/d`` (rounding adds ≈ 1/12); when
    that construction is direct response, also the errors of the best design with Hadamard support sets.
    """
    d = len(EXAMPLE_COUNTS)
    values = np.repeat(np.arange(d), EXAMPLE_COUNTS)
    n = values.size
    truth = np.asarray(EXAMPLE_COUNTS, dtype=float)
    rng = np.random.default_rng(seed)
    mine = HadamardResponse(EXAMPLE_EPSILON, d)

    def errors(oracle: HadamardResponse) -> list[float]:
        return [float(np.mean((np.round(oracle.estimate(oracle.privatize(values, rng)) * n) - truth) ** 2))
                for _ in range(runs)]

    ours = errors(mine)
    # the best design with Hadamard support sets (rows >= 1), for comparison when the choice is direct response
    best = min((m for m in _admissible_rows(d) if m >= 1), key=lambda m: _design_variance(EXAMPLE_EPSILON, d, m))
    forced = HadamardResponse(EXAMPLE_EPSILON, d, rows=best)
    hadamard = errors(forced) if mine.rows == 0 else None
    theirs: list[float] | None = None
    try:
        hr = _pure_ldp("hadamard_response")
    except ImportError:
        hr = None
    if hr is not None:
        np.random.seed(seed)  # the peer draws from numpy's and Python's global generators
        random.seed(seed)
        theirs = []
        for _ in range(runs):
            server = hr.HadamardResponseServer(EXAMPLE_EPSILON, d, index_mapper=_identity)
            client = hr.HadamardResponseClient(EXAMPLE_EPSILON, d, server.get_hash_funcs(), index_mapper=_identity)
            for v in values.tolist():
                server.aggregate(client.privatise(v))
            est = np.round(np.asarray(server.estimate_all(range(d), suppress_warnings=True), dtype=float))
            theirs.append(float(np.mean((est - truth) ** 2)))
    analytic = float(np.mean(n * mine.variance(truth / n)))
    forced_analytic = float(np.mean(n * forced.variance(truth / n)))
    return {"haarvest": ours, "pure-ldp": theirs, "rows": mine.rows, "K": mine.K, "analytic": analytic, "n": n,
            "hadamard": hadamard, "hadamard_rows": best, "hadamard_analytic": forced_analytic}


def _example_lines(runs: int) -> list[str]:
    print("[bench] frequency: pure-ldp example.py scenario ...", file=sys.stderr, flush=True)
    res = example_scenario(runs)
    ours = np.asarray(res["haarvest"])

    def cell(x: np.ndarray) -> str:
        return f"{x.mean():,.0f} ± {x.std(ddof=1) / np.sqrt(x.size):,.0f}"

    design = "direct response (rows = 0)" if res["rows"] == 0 else f"rows = {res['rows']}, K = {res['K']}"
    lines = [
        "",
        f"Hadamard response on pure-ldp's `example.py` scenario: d = {len(EXAMPLE_COUNTS)} items, n = {res['n']:,}, "
        f"ε = {EXAMPLE_EPSILON:g}, {runs} runs; error = mean over the items of the squared error of the rounded count "
        f"estimates (mean ± SE over the runs). haarvest chose {design} (the least variance at this k and ε); "
        f"its analytic expectation is {res['analytic']:,.0f} (+ ≈ 0.08 for rounding). pure-ldp uses its general "
        "(block) HR above ε = 1.",
        "",
        "| implementation | squared count error | ratio to pure-ldp |",
        "|---|---:|---:|",
    ]
    rows = [("haarvest HadamardResponse", ours)]
    if res["hadamard"] is not None:
        label = f"haarvest HadamardResponse(rows={res['hadamard_rows']}) (analytic {res['hadamard_analytic']:,.0f})"
        rows.append((label, np.asarray(res["hadamard"])))
    if res["pure-ldp"] is None:
        lines += [f"| {name} | {cell(x)} | — (pure-ldp not installed) |" for name, x in rows]
        return lines
    theirs = np.asarray(res["pure-ldp"])
    for name, x in rows:
        ratio = x.mean() / theirs.mean()
        print(f"[bench] example.py HR ε=3: {name} {x.mean():,.0f} vs pure-ldp {theirs.mean():,.0f}, ratio {ratio:.3f}",
              file=sys.stderr, flush=True)
        lines.append(f"| {name} | {cell(x)} | {ratio:.3f} |")
    lines.append(f"| pure-ldp HadamardResponse | {cell(theirs)} | 1 |")
    return lines


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def run(quick: bool) -> str:
    n = 2_000 if quick else 100_000
    n_peer = 200 if quick else 10_000
    repeats = 1 if quick else 3
    data_rng = np.random.default_rng(SEED)
    probs = 1.0 / np.arange(1, K + 1) ** 1.1
    values = data_rng.choice(K, size=n, p=probs / probs.sum())
    truth = np.bincount(values[:n_peer], minlength=K) / n_peer
    np.random.seed(SEED)  # the peers draw from numpy's and Python's global generators
    random.seed(SEED)

    impls = haarvest_impls(np.random.default_rng(SEED + 1))
    notes: list[str] = []
    for loader in (multi_freq_impls, pure_ldp_impls):
        try:
            impls += loader()
        except ImportError as exc:  # peers are optional (pip install -e ".[bench]")
            notes.append(f"- {loader.__name__.strip('_').replace('_impls', '')}: not benchmarked ({exc}).")

    rows: list[Row] = []
    for impl in impls:
        print(f"[bench] frequency: {impl.name} ...", file=sys.stderr, flush=True)
        rows.append(_measure(impl, values, n_peer, repeats))

    main = ("GRR", "OUE", "OLH", "HR")
    base = {r.oracle: r for r in rows if r.implementation.startswith("haarvest")}
    lines = [
        "## Frequency oracles (haarvest vs multi-freq-ldpy and pure-ldp)",
        "",
        f"n = {n:,} users, k = {K}, ε = {EPSILON:g}, Zipf(1.1) data; multi-freq-ldpy {_version('multi-freq-ldpy')}, "
        f"pure-ldp {_version('pure-ldp')}, numpy {np.__version__}. Client = privatize cost per report; decode = "
        f"reports → all k estimates at n = {n:,} (best of {repeats} for haarvest). † = peer run at "
        f"n = {n_peer:,} and its decode time scaled ×{n // n_peer} (its aggregation is a per-report Python loop). "
        "Speed-up = peer time / haarvest time. Accuracy and memory compare equal inputs: every implementation "
        f"privatizes and decodes the same first {n_peer:,} users; n·MSE = n × mean squared error over the k items "
        "(raw estimate, and after clip-and-normalise), analytic = mean of haarvest's `variance(f)` (the expected raw "
        "n·MSE); multi-freq-ldpy's MI aggregator already clips and renormalises. Peak = tracemalloc peak of that "
        "decode (excluding the reports themselves).",
        "",
        "| oracle | implementation | client µs/report | client speed-up | decode (n = "
        f"{n:,}) | decode speed-up | peak MiB | n·MSE | n·MSE clip+norm | analytic n·MSE |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in main:
        ref = base[label]
        analytic = _analytic_nmse(label, truth)
        for r in (r for r in rows if r.oracle == label):
            mine = r is ref
            lines.append(
                f"| {label} | {r.implementation} | {r.client_us:.3f} | "
                f"{'1×' if mine else f'{r.client_us / ref.client_us:,.0f}×'} | "
                f"{_fmt_time(r.decode_s)}{' †' if r.extrapolated else ''} | "
                f"{'1×' if mine else f'{r.decode_s / ref.decode_s:,.0f}×'} | "
                f"{r.peak_mib:.2f} | {r.nmse:.2f} | {r.nmse_clipped:.3f} | {analytic:.2f} |"
            )
    lines += [
        "",
        "haarvest's other oracles on the same data:",
        "",
        "| oracle | client µs/report | decode | peak MiB | n·MSE | analytic n·MSE |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.implementation.startswith("haarvest") and r.oracle not in main:
            lines.append(
                f"| {r.implementation} | {r.client_us:.3f} | {_fmt_time(r.decode_s)} | {r.peak_mib:.2f} | "
                f"{r.nmse:.2f} | {_analytic_nmse(r.oracle, truth):.2f} |"
            )
    lines += _example_lines(4 if quick else 20)
    if _XXHASH_SHIMMED:
        notes.append(
            f"- xxhash {_version('xxhash')} rejects str input: the peers' local hashing ran through a "
            "UTF-8 encoding wrapper (same digests, one extra Python call per hash); pin xxhash<4 to avoid it."
        )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"
