"""Shared pieces of the evaluation: configuration and seeding, result sections, statistics, plots.

Every experiment module exposes ``NAME``, ``TITLE`` and ``run(config: EvalConfig) -> Section``. Randomness comes
only from :meth:`EvalConfig.rng`, which derives an independent, reproducible generator from the global seed and
a tuple of labels (experiment, method, ε, repetition, ...), so results do not depend on the order experiments run.
"""

from __future__ import annotations

import functools
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "DEFAULT_SEED",
    "EvalConfig",
    "Stat",
    "summarise",
    "significantly_less",
    "best_of",
    "series_of",
    "Table",
    "Figure",
    "Section",
    "progress",
    "fmt_float",
    "pyplot",
    "Panel",
    "panel_plot",
    "line_plot",
    "bar_plot",
    "Timer",
]

DEFAULT_SEED = 20261122
T = TypeVar("T")


@dataclass(frozen=True)
class EvalConfig:
    """How an evaluation run is sized and where it writes.

    ``quick`` shrinks every experiment (fewer users, ε values and repetitions) so the whole run takes < 60 s;
    ``reps`` repetitions give the mean ± std error bars; ``out_dir`` receives ``results.md`` and ``img/*.png``.
    """

    out_dir: Path
    quick: bool = False
    reps: int = 10
    seed: int = DEFAULT_SEED
    show_progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < 2:
            raise ValueError(f"reps must be an integer >= 2 (error bars need repetitions), got {self.reps!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def img_dir(self) -> Path:
        return self.out_dir / "img"

    def syn(self) -> np.ndarray:
        """The Syn series (n = 10,000, τ = 120, k = 360) shared by every experiment of this run (seeded by the run)."""
        return _syn_for_seed(self.seed)

    def rng(self, *labels: Any) -> np.random.Generator:
        """An independent generator for one configuration: SeedSequence(seed, crc32 of each label)."""
        words = [zlib.crc32(repr(label).encode()) for label in labels]
        return np.random.default_rng(np.random.SeedSequence([self.seed, *words]))


@functools.lru_cache(maxsize=2)
def _syn_for_seed(seed: int) -> np.ndarray:
    from simulations.datasets import generate_syn

    series = generate_syn(np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(b"syn")])))
    series.flags.writeable = False  # shared by the experiments of a run
    return series


def progress(items: Iterable[T], config: EvalConfig, desc: str, total: int | None = None) -> Iterable[T]:
    """A tqdm progress bar on stderr (a plain iterator when progress is off or tqdm is missing)."""
    if not config.show_progress:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the eval extra is optional for the quick CI mode
        return items
    return tqdm(items, desc=desc, total=total, leave=False, dynamic_ncols=True)


@dataclass(frozen=True)
class Stat:
    """Mean ± sample standard deviation over repetitions."""

    mean: float
    std: float
    n: int

    def fmt(self, digits: int = 3) -> str:
        """"mean ± std", or just the mean for a single measurement."""
        if self.n <= 1:
            return fmt_float(self.mean, digits)
        return f"{fmt_float(self.mean, digits)} ± {fmt_float(self.std, 2)}"


def summarise(values: Iterable[float]) -> Stat:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError("cannot summarise zero values")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return Stat(float(arr.mean()), std, int(arr.size))


def significantly_less(a: Stat, b: Stat, z: float = 2.0) -> bool:
    """a < b by more than z standard errors of the difference of the two means (independent repetitions)."""
    se = math.sqrt(a.std**2 / max(a.n, 1) + b.std**2 / max(b.n, 1))
    return b.mean - a.mean > z * se


def best_of(stats: Mapping[str, Stat], digits: int = 3) -> str:
    """"label (value)" of the smallest mean, naming every other label within 2 standard errors as a tie."""
    best = min(stats, key=lambda k: stats[k].mean)
    ties = [k for k in stats if k != best and not significantly_less(stats[best], stats[k])]
    text = f"{best} ({fmt_float(stats[best].mean, digits)})"
    if ties:
        text += f", statistically tied with {', '.join(ties)}"
    return text


def series_of(
    stats: Mapping[str, Mapping[Any, Stat]], xs: Sequence[Any]
) -> dict[str, tuple[list[float], list[float]]]:
    """``{label: {x: Stat}}`` → ``{label: (means, stds)}`` over ``xs`` (the form the plots take)."""
    return {label: ([by_x[x].mean for x in xs], [by_x[x].std for x in xs]) for label, by_x in stats.items()}


def fmt_float(x: float, digits: int = 3) -> str:
    """Compact number: scientific below 1e-3 or above 1e4, else fixed with ``digits`` significant digits."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    ax = abs(x)
    if ax < 1e-3 or ax >= 1e4:
        return f"{x:.{max(digits - 1, 0)}e}"
    return f"{x:.{digits}g}"


@dataclass
class Table:
    """A Markdown table (cells already formatted)."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"row has {len(cells)} cells, header has {len(self.header)}")
        self.rows.append([str(c) for c in cells])

    def to_markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.header) + " |"]
        lines.append("| " + " | ".join("---" for _ in self.header) + " |")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass(frozen=True)
class Figure:
    filename: str  # relative to the image directory
    caption: str


@dataclass
class Section:
    """One experiment's contribution to docs/generated/results.md, plus its raw numbers (``data``) for tests."""

    name: str
    title: str
    setup: str
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    headline: list[str] = field(default_factory=list)  # one or two plain sentences for the report's summary

    def to_markdown(self, img_prefix: str = "img") -> str:
        parts = [f"## {self.title}", "", self.setup.strip(), ""]
        if self.findings:
            parts += ["**Findings.**", ""] + [f"- {f}" for f in self.findings] + [""]
        for table in self.tables:
            parts += [table.to_markdown(), ""]
        for fig in self.figures:
            parts += [f"![{fig.caption}]({img_prefix}/{fig.filename})", "", f"*{fig.caption}*", ""]
        parts.append(f"<sub>Section run time: {self.seconds:.1f} s.</sub>")
        return "\n".join(parts) + "\n"


class Timer:
    """Wall-clock seconds of a ``with`` block (``time.perf_counter``)."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


# ------------------------------------------------------------------------------------------------------------ plots

_MARKERS = "osD^v<>px*h"


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class Panel:
    """One axes of a line plot: ``series[label] = (means, stds)`` over ``x``; ``reference`` adds dotted lines.

    Error bars are ± std; on a log axis the lower bar is cut at 90 % of the mean (mean - std may be ≤ 0).
    """

    x: Sequence[float]
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]]
    xlabel: str
    ylabel: str
    title: str
    logx: bool = False
    logy: bool = True
    reference: Mapping[str, Sequence[float]] | None = None
    dashed: Callable[[str], bool] | None = None


def _draw_panel(ax: Any, panel: Panel) -> None:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(panel.series) <= 10 else "tab20"]
    for i, (label, (means, stds)) in enumerate(panel.series.items()):
        m = np.asarray(means, dtype=float)
        s = np.asarray(stds, dtype=float)
        style = "--" if panel.dashed is not None and panel.dashed(label) else "-"
        lower = np.minimum(s, 0.9 * m) if panel.logy else s  # a log axis cannot show mean - std <= 0
        ax.errorbar(panel.x, m, yerr=np.vstack([lower, s]), label=label, marker=_MARKERS[i % len(_MARKERS)],
                    linestyle=style, capsize=3, markersize=5, linewidth=1.4, color=cmap(i % cmap.N))
    for label, values in (panel.reference or {}).items():
        ax.plot(panel.x, values, linestyle=":", color="0.35", linewidth=1.0, label=label)
    if panel.logx:
        import matplotlib.ticker

        ax.set_xscale("log")
        ax.set_xticks(list(panel.x))
        ax.set_xticklabels([f"{v:g}" for v in panel.x])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if panel.logy:
        ax.set_yscale("log")
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7.5, loc="best", framealpha=0.85)


def panel_plot(path: Path, panels: Sequence[Panel], ncols: int = 2) -> None:
    """Several line panels in one PNG (error bars = std over repetitions)."""
    plt = pyplot()
    ncols = min(ncols, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.4 * nrows), dpi=110, squeeze=False)
    for ax, panel in zip(axes.ravel(), panels):
        _draw_panel(ax, panel)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def line_plot(path: Path, x: Sequence[float], series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
              **kwargs: Any) -> None:
    """A single :class:`Panel` (keyword arguments as in :class:`Panel`) saved to ``path``."""
    panel_plot(path, [Panel(x, series, **kwargs)], ncols=1)


def bar_plot(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    ylabel: str,
    title: str,
    logy: bool = True,
) -> None:
    """Grouped bars with error bars: one group per entry of ``groups``, one bar per series."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 4.6), dpi=110)
    width = 0.8 / max(1, len(series))
    base = np.arange(len(groups))
    for i, (label, (means, stds)) in enumerate(series.items()):
        ax.bar(base + i * width - 0.4 + width / 2, means, width, yerr=stds, label=label, capsize=2)
    ax.set_xticks(base)
    ax.set_xticklabels(groups, fontsize=9)
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, framealpha=0.85)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
