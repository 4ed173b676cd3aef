"""haarvest.protocols — the local differential privacy mechanism library shared by devices and coordinator.

Every mechanism follows one interface (see :mod:`protocols.base`): a validated constructor taking ``epsilon``
(and ``k`` for frequency oracles, ``d`` for vectors), ``privatize(values, rng)`` vectorised over users,
``estimate(reports)`` giving unbiased estimates, ``variance(...)`` giving the analytic per-user variance, and
``epsilon``/``delta`` attributes stating the exact guarantee.
"""
