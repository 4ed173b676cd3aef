"""``haarvest simulate``: the eval and flower sub-subcommands parse, and flower is imported only when run."""

from __future__ import annotations

import argparse
import sys
import types

from simulations import cli


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haarvest")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_eval_arguments_parse():
    args = _parser().parse_args(["simulate", "eval", "--quick", "--only", "range", "timing", "--reps", "3",
                                 "--seed", "5"])
    assert args.func is cli.run_eval and args.quick and args.only == ["range", "timing"]
    assert args.reps == 3 and args.seed == 5


def test_eval_rejects_bad_values(capsys):
    parser = _parser()
    for bad in (["--reps", "1"], ["--seed", "-1"]):
        try:
            parser.parse_args(["simulate", "eval", *bad])
        except SystemExit as exc:
            assert exc.code == 2
        else:  # pragma: no cover
            raise AssertionError(bad)


def test_unknown_experiment_is_a_clean_error(capsys):
    args = _parser().parse_args(["simulate", "eval", "--only", "nope"])
    assert args.func(args) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_flower_hands_its_arguments_to_flower_sim(monkeypatch):
    seen = {}
    fake = types.ModuleType("simulations.flower_sim")

    def add_arguments(p):
        p.add_argument("--devices", type=int)

    def run_from_args(a):
        seen["devices"] = a.devices
        return 0

    fake.add_arguments, fake.run_from_args = add_arguments, run_from_args
    monkeypatch.setitem(sys.modules, "simulations.flower_sim", fake)
    args = _parser().parse_args(["simulate", "flower", "--devices", "7"])
    assert args.func(args) == 0 and seen == {"devices": 7}


def test_flower_main_fallback_and_missing_entry(monkeypatch, capsys):
    fake = types.ModuleType("simulations.flower_sim")
    monkeypatch.setitem(sys.modules, "simulations.flower_sim", fake)
    args = _parser().parse_args(["simulate", "flower"])
    assert args.func(args) == 2
    assert "neither main(args)" in capsys.readouterr().err
    fake.main = lambda a: 3
    assert args.func(args) == 3
