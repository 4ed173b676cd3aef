"""Everything a user types: every option has help text, every error is one line and a non-zero exit (never a
traceback), a read-only command never creates a database, `| head` is not an error."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from haarvest.cli import build_parser, one_line

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1}, "dims": ["cpu"],
                "bounds": [[0, 100]]}}


def _options(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", "(command)", helps.get(name)
                yield from _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_command_and_option_has_help_text():
    missing = [f"{cmd} {opt}" for cmd, opt, text in _options(build_parser(), "haarvest")
               if not text or text == argparse.SUPPRESS]
    assert not missing, missing


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "haarvest.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    res = _run("coordinator", "rounds", "open", "--db", "c.db", "--id", "r1", "--epsilon", "1", "--params",
               json.dumps({"streams": SPEC}), "--no-publish", cwd=d)
    assert res.returncode == 0, res.stderr
    return d


@pytest.mark.parametrize("args, says", [
    (["coordinator", "estimate", "r9", "--db", "c.db"], "unknown round 'r9'"),
    (["coordinator", "estimate", "r1", "--db", "typo.db"], "no database at typo.db"),
    (["coordinator", "export", "--db", "typo.db"], "no database at typo.db"),
    (["coordinator", "devices", "--db", "typo.db"], "no database at typo.db"),
    (["coordinator", "rounds", "open", "--db", "c.db", "--id", "r2", "--epsilon", "0.001", "--no-publish",
      "--params", json.dumps({"streams": SPEC})], "more than the round's ε = 0.001"),
    (["coordinator", "rounds", "open", "--db", "c.db", "--id", "r3", "--epsilon", "1", "--no-publish",
      "--params", '{"streams":["cpu"]}'], "streams must map each stream name to its StreamSpec"),
    (["coordinator", "rounds", "open", "--db", "c.db", "--id", "r4", "--epsilon", "1", "--no-publish",
      "--params", "{not json"], ""),
    (["agent", "status", "--config", "/nonexistent/agent.toml"], "cannot read config file"),
])
def test_errors_are_one_line_with_a_non_zero_exit_and_change_nothing(db, args, says):
    before = sorted(p.name for p in db.iterdir())
    res = _run(*args, cwd=db)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert says in lines[0]
    assert sorted(p.name for p in db.iterdir()) == before  # no database created, nothing else written


def test_a_reader_that_leaves_early_is_not_an_error(db):
    """`haarvest coordinator rounds list | head`: the reader is gone before the command writes (its end of the pipe
    closed at once), so every write fails with EPIPE — exit 0 and nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "haarvest.cli", "coordinator", "rounds", "list", "--db", "c.db",
                             "--full"], cwd=db, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b""


def test_validation_errors_read_as_where_and_what():
    from pydantic import BaseModel, ValidationError

    class M(BaseModel):
        a: int
        b: int

    with pytest.raises(ValidationError) as exc:
        M.model_validate({"a": "x", "b": "y"})
    assert one_line(exc.value) == "a: Input should be a valid integer, unable to parse string as an integer " \
                                  "(and 1 more)"
    assert one_line(ValueError("first\nsecond")) == "first"
