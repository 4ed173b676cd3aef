"""Reading a TOML configuration file: the one reader of the device's and the coordinator's config files.

Both sides report a missing or unreadable file and invalid TOML the same way, as one line naming the file, through
their own error class (:class:`~protocols.errors.ConfigError` on the device,
:class:`~protocols.errors.RunConfigError` on the coordinator).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

__all__ = ["read_toml"]


def read_toml(path: str | Path, error: type[Exception]) -> dict[str, Any]:
    """The TOML table in the file at ``path``; ``error`` (one line, the file named) if it cannot be read or is not
    valid UTF-8 TOML."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
