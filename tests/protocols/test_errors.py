"""protocols.errors is the one public error surface: every exception class haarvest defines lives there, under
HaarvestError, and the reason codes are enums that refuse unknown codes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import protocols.errors as errors

PACKAGES = ("protocols", "edge_agent", "coordinator", "simulations", "haarvest")
OPTIONAL = ("flwr", "psycopg", "matplotlib")  # modules whose optional dependency may be missing are skipped


def _modules():
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue
            try:
                yield importlib.import_module(info.name)
            except ImportError as exc:
                if not any(name in str(exc) for name in OPTIONAL):
                    raise


def test_every_exception_class_lives_in_protocols_errors():
    defined_elsewhere = sorted(
        f"{mod.__name__}.{name}"
        for mod in _modules()
        for name, obj in vars(mod).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__
        and mod is not errors
    )
    assert defined_elsewhere == []


def test_every_error_has_the_common_base_and_its_builtin():
    public = [getattr(errors, name) for name in errors.__all__ if name != "HaarvestError"]
    classes = [c for c in public if inspect.isclass(c) and issubclass(c, BaseException)]
    assert len(classes) == 14  # MissingPostgres (simulations.postgres) is the 13th, OffGridError (SPEC §3.0) the 14th
    for cls in classes:
        assert issubclass(cls, errors.HaarvestError)
    assert issubclass(errors.WireError, ValueError) and issubclass(errors.SourceError, RuntimeError)


@pytest.mark.parametrize("cls, args", [
    (errors.WireError, ("no_such_reason",)),
    (errors.Refused, ("no_such_reason",)),
    (errors.SpecMismatch, ("no_such_reason", "detail")),
    (errors.InvalidRecord, ("no_such_reason", "dim")),
    (errors.BudgetExceededError, ("no_such_reason",)),
])
def test_unknown_reason_codes_are_refused(cls, args):
    with pytest.raises(ValueError, match="unknown .*Reason 'no_such_reason'; known: "):
        cls(*args)


def test_reasons_read_as_their_codes():
    exc = errors.Refused("stream_cap", "stream 'x' spent 1 + 1 > cap 1")
    assert exc.reason == "stream_cap" and f"{exc.reason}" == "stream_cap"
    assert str(exc) == "stream_cap: stream 'x' spent 1 + 1 > cap 1"
    assert str(errors.WireError("too_large")) == "too_large"
    assert "duplicate" in tuple(errors.RejectReason)  # the validator's reason codes are protocols.errors' own
