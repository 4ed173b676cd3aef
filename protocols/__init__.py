"""haarvest.protocols — the local differential privacy mechanism library shared by devices and coordinator.

**The front door** (like IBM diffprivlib's): every mechanism is declared once in :mod:`protocols.catalogue` and
reachable from here, by class or by its wire name::

    import protocols
    mech = protocols.OUE(1.0, 10)                  # or protocols.build("oue", epsilon=1.0, k=10)
    reports = mech.privatize(values, rng)          # vectorised over users: one report row per user
    freq = mech.estimate(reports)                  # unbiased estimate; mech.variance(...) its analytic variance

Every mechanism follows one interface (:mod:`protocols.base`): a validated constructor taking ``epsilon`` (and ``k``
for frequency oracles, ``d`` for vectors; ValueError on bad values), ``privatize(values, rng)`` vectorised over
users, ``estimate(reports)`` giving unbiased estimates, ``variance(...)`` the analytic per-user variance, and
``epsilon``/``delta`` stating the exact guarantee. Longitudinal protocols report through per-device clients
(``mech.client(...).report(value)``) and are estimated per round (``mech.estimate_round(rows)``). Errors raised on
purpose derive from :class:`protocols.errors.HaarvestError`.

Classes are imported on first access, so ``import protocols`` stays light on a device.
"""

from __future__ import annotations

from typing import Any

from protocols.catalogue import CATALOGUE, Family, Role, build, entry, names
from protocols.errors import HaarvestError

#: exported class name → wire name, from the catalogue (``protocols.OUE`` is ``entry("oue").cls``)
_CLASSES: dict[str, str] = {e.target.partition(":")[2]: e.name for e in CATALOGUE}

__all__ = ["build", "entry", "names", "Family", "Role", "CATALOGUE", "HaarvestError", *sorted(_CLASSES)]


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return entry(_CLASSES[name]).cls
    raise AttributeError(f"module 'protocols' has no attribute {name!r}")
