"""Run the evaluation experiments and write the report (``haarvest simulate eval``).

The experiments are modules of this package listed in :data:`EXPERIMENTS` (report order); each exposes ``NAME``,
``TITLE`` and ``run(config) -> Section``. A full run writes ``docs/generated/results.md`` and ``docs/generated/img/*.png``; quick runs
and ``--only`` runs write to ``out/eval-quick`` / ``out/eval`` unless ``--out`` is given, so they never overwrite
the committed report with partial or small-sample numbers. ``--only NAME … --in-place`` is the exception: it runs
those experiments at full size and splices their sections (and summary lines, and plots) into the committed
report, leaving the others as they are (:func:`regenerate_in_place`, :func:`~simulations.eval.report.splice_sections`).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from simulations import GENERATED_DOCS
from simulations.eval._blas import limit_blas_threads
from simulations.eval.common import DEFAULT_SEED, EvalConfig, Section, progress
from simulations.eval.report import REPORT_NAME, splice_sections, write_report

__all__ = ["EXPERIMENTS", "REPO_ROOT", "experiment_modules", "run_experiments", "regenerate_in_place",
           "default_out_dir", "main"]

#: Experiment modules in report order.
EXPERIMENTS: tuple[str, ...] = (
    "exp_epsilon",
    "exp_dimension",
    "exp_datasets",
    "exp_evolving",
    "exp_timing",
    "exp_privacy",
    "exp_device",
    "exp_range",
    "exp_distribution",
)
REPO_ROOT = Path(__file__).resolve().parents[2]


def experiment_modules(only: Sequence[str] | None = None) -> list[ModuleType]:
    """Import the experiment modules, optionally restricted by ``NAME`` (or module name)."""
    modules = [importlib.import_module(f"simulations.eval.{name}") for name in EXPERIMENTS]
    if not only:
        return modules
    wanted = set(only)
    known = {m.NAME for m in modules} | set(EXPERIMENTS)
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; known: {', '.join(m.NAME for m in modules)}")
    return [m for m in modules if m.NAME in wanted or m.__name__.rsplit(".", 1)[1] in wanted]


def default_out_dir(quick: bool, only: Sequence[str] | None) -> Path:
    if quick:
        return REPO_ROOT / "out" / "eval-quick"
    if only:
        return REPO_ROOT / "out" / "eval"
    return REPO_ROOT / GENERATED_DOCS


def run_experiments(config: EvalConfig, only: Sequence[str] | None = None) -> tuple[list[Section], Path]:
    """Run the selected experiments, write ``results.md`` (and the PNGs) into ``config.out_dir``."""
    modules = experiment_modules(only)
    limit_blas_threads(1)  # see simulations.eval._blas: multi-threaded BLAS on a busy 2-core machine is far slower
    sections = []
    start = time.perf_counter()
    for module in progress(modules, config, "haarvest eval"):
        t0 = time.perf_counter()
        section = module.run(config)
        section.seconds = time.perf_counter() - t0
        if config.show_progress:
            print(f"[eval] {module.NAME}: {section.seconds:.1f} s", file=sys.stderr, flush=True)
        sections.append(section)
    total = time.perf_counter() - start
    path = write_report(sections, config, total_seconds=total, repo_root=REPO_ROOT, partial=bool(only))
    return sections, path


def regenerate_in_place(config: EvalConfig, only: Sequence[str]) -> tuple[list[Section], Path]:
    """Run the ``only`` experiments at full size and splice their sections into the committed report
    (``config.out_dir / results.md``, which must exist), writing their plots beside it."""
    path = config.out_dir / REPORT_NAME
    if not path.is_file():
        raise ValueError(f"--in-place needs an existing full report at {path} (run `make eval` once)")
    modules = experiment_modules(only)
    limit_blas_threads(1)
    sections = []
    for module in modules:
        t0 = time.perf_counter()
        section = module.run(config)
        section.seconds = time.perf_counter() - t0
        sections.append(section)
    note = (f"Regenerated in place on {time.strftime('%Y-%m-%d %H:%M')} by `haarvest simulate eval --only "
            f"{' '.join(m.NAME for m in modules)} --in-place` (seed {config.seed}, --reps {config.reps}); the rest of "
            "the report is from the run named at its top.")
    path.write_text(splice_sections(path.read_text(encoding="utf-8"), sections, note), encoding="utf-8")
    return sections, path


def main(args: object) -> int:
    """Entry point of ``haarvest simulate eval`` (``args`` from :mod:`simulations.cli`)."""
    quick = bool(getattr(args, "quick", False))
    only = getattr(args, "only", None) or None
    reps = getattr(args, "reps", None) or (2 if quick else 10)
    out = getattr(args, "out", None)
    in_place = bool(getattr(args, "in_place", False))
    if in_place and (quick or not only):
        raise ValueError("--in-place regenerates the --only sections of the full report at full size "
                         "(give --only, not --quick)")
    config = EvalConfig(
        out_dir=Path(out) if out else (REPO_ROOT / GENERATED_DOCS if in_place else default_out_dir(quick, only)),
        quick=quick,
        reps=int(reps),
        seed=DEFAULT_SEED if getattr(args, "seed", None) is None else int(args.seed),  # type: ignore[attr-defined]
        show_progress=not bool(getattr(args, "no_progress", False)),
    )
    if in_place:
        _, path = regenerate_in_place(config, only or [])
    else:
        _, path = run_experiments(config, only)
    print(f"wrote {path}")
    return 0
