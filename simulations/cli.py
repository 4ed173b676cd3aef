"""``haarvest simulate …``: the research evaluation and the Flower fleet simulation.

* ``haarvest simulate eval [--quick] [--only NAME … [--in-place]] [--reps R] [--seed S] [--out DIR]`` runs the
  experiments of :mod:`simulations.eval` and writes ``results.md`` plus ``img/*.png`` (``docs/generated/`` for a full run);
* ``haarvest simulate flower …`` runs :func:`simulations.flower_sim.main` (imported only when asked for).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

__all__ = ["register", "run_eval", "run_flower", "main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"need at least 2 repetitions (error bars), got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer seed, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer seed, got {value}")
    return value


def run_eval(args: argparse.Namespace) -> int:
    from simulations.eval.runner import main

    try:
        return main(args)
    except ValueError as exc:  # bad --only name, missing dataset: a clear message, not a traceback
        print(f"haarvest simulate eval: error: {exc}", file=sys.stderr)
        return 2


def run_flower(args: argparse.Namespace) -> int:
    """Import :mod:`simulations.flower_sim` only now and hand it the remaining arguments.

    The module may expose ``add_arguments(parser)`` + ``run_from_args(args)`` (its own options are parsed here) or a
    ``main(args)`` taking the raw namespace (``args.flower_args`` holds the unparsed arguments).
    """
    try:
        module = importlib.import_module("simulations.flower_sim")
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if name != "simulations.flower_sim" and not name.startswith("flwr"):
            raise
        hint = " (install the extra: pip install -e '.[flower]')" if name.startswith("flwr") else ""
        print(f"haarvest simulate flower: not available: {exc}{hint}", file=sys.stderr)
        return 2
    add_arguments: Any = getattr(module, "add_arguments", None)
    run_from_args: Any = getattr(module, "run_from_args", None)
    if callable(add_arguments) and callable(run_from_args):
        summary = (module.__doc__ or "").split("\n")[0]
        parser = argparse.ArgumentParser(prog="haarvest simulate flower", description=summary)
        add_arguments(parser)
        return int(run_from_args(parser.parse_args(args.flower_args)) or 0)
    entry: Any = getattr(module, "main", None)
    if callable(entry):
        return int(entry(args) or 0)
    print("haarvest simulate flower: simulations.flower_sim defines neither main(args) nor "
          "add_arguments/run_from_args", file=sys.stderr)
    return 2


def register(subparsers: Any) -> None:
    """Add ``simulate`` with its ``eval`` and ``flower`` sub-subcommands to the ``haarvest`` parser."""
    simulate = subparsers.add_parser("simulate", help="simulations: the research evaluation, the Flower fleet")
    sub = simulate.add_subparsers(dest="simulate_command", required=True)

    ev = sub.add_parser(
        "eval",
        help="reproduce the thesis's experiments honestly (docs/generated/results.md, docs/generated/img/*.png)",
        description="Run the evaluation experiments (SPEC §6) and write results.md with tables and PNG plots.",
    )
    ev.add_argument("--quick", action="store_true", help="small sizes (< 60 s; writes to out/eval-quick)")
    ev.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only these experiments (epsilon, dimension, datasets, evolving, timing, privacy, device, "
                    "range, distribution)")
    ev.add_argument("--reps", type=_positive_int, default=None, help="repetitions per configuration (default 10; "
                    "quick 2)")
    ev.add_argument("--seed", type=_seed, default=None, help="global seed (default 20261122)")
    ev.add_argument("--out", default=None, help="output directory (default docs/generated/ for a full run)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bars")
    ev.add_argument("--in-place", action="store_true", help="with --only: run those experiments at full size and "
                    "replace their sections in the committed docs/generated/results.md (the others are kept)")
    ev.set_defaults(func=run_eval)

    # prefix_chars="+": every following word, "--devices" and "--help" included, is handed to flower_sim's own parser.
    fl = sub.add_parser("flower", help="Flower fleet simulation (simulations/flower_sim.py)", add_help=False,
                        prefix_chars="+")
    fl.add_argument("flower_args", nargs="*", help="arguments passed to simulations.flower_sim")
    fl.set_defaults(func=run_flower)


def main(argv: list[str] | None = None) -> int:
    """``python -m simulations.cli simulate eval …`` — the same commands without the ``haarvest`` entry point."""
    parser = argparse.ArgumentParser(prog="python -m simulations.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
