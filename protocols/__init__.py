"""haarvest.protocols — the local differential privacy mechanism library shared by devices and coordinator.

**The front door** (like IBM diffprivlib's): every mechanism is declared once in :mod:`protocols.catalogue` and
reachable from here, by class or by its wire name::

    import protocols
    mech = protocols.OUE(1.0, 10)                  # or protocols.build("oue", epsilon=1.0, k=10)
    reports = mech.privatize(values, rng)          # vectorised over users: one report row per user
    freq = mech.estimate(reports)                  # unbiased estimate; mech.variance(...) its analytic variance

Every mechanism follows one interface (:mod:`protocols.base`): a validated constructor taking ``epsilon`` (and ``k``
for frequency oracles, ``d`` for vectors; ValueError on bad values), ``privatize(values, rng)`` vectorised over
users, ``estimate(reports)``, and ``epsilon``/``delta`` stating the exact guarantee; every mechanism but Square Wave
+ EMS is an :class:`~protocols.base.AnalyticMechanism`, whose estimates are unbiased with ``variance(...)`` their
analytic per-user variance. Longitudinal protocols report through per-device clients
(``mech.client(...).report(value)``) and are estimated per round (``mech.estimate_round(rows)``). Errors raised on
purpose derive from :class:`protocols.errors.HaarvestError`.

Everything here is imported on first access (PEP 562), so ``import protocols.mqtt`` or ``import protocols.wire``
loads nothing else — the coordinator's MQTT receiver process stays free of numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the front door's names → their home modules
_HOMES = {"build": "protocols.catalogue", "entry": "protocols.catalogue", "names": "protocols.catalogue",
          "Family": "protocols.catalogue", "Role": "protocols.catalogue", "CATALOGUE": "protocols.catalogue",
          "HaarvestError": "protocols.errors"}


def __getattr__(name: str) -> Any:
    """The front door, resolved on first access: catalogue functions, the error base, and every catalogued class by
    its class name (``protocols.OUE`` is ``protocols.entry("oue").cls``); ``__all__`` lists them all."""
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    if name != "__all__" and not name[:1].isupper():  # a submodule (``from protocols import mqtt``) or a typo
        raise AttributeError(f"module 'protocols' has no attribute {name!r}")
    catalogue = importlib.import_module("protocols.catalogue")
    classes = {e.target.partition(":")[2]: e for e in catalogue.CATALOGUE}
    if name == "__all__":
        return [*_HOMES, *sorted(classes)]
    if name in classes:
        return classes[name].cls
    raise AttributeError(f"module 'protocols' has no attribute {name!r}")
