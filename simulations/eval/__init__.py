"""The research evaluation (SPEC §6; thesis chapter 5, made honest): one module per experiment plus a runner.

``haarvest simulate eval [--quick] [--only NAME] [--reps R] [--seed S]`` runs them (``make eval``) and writes
``docs/generated/results.md`` with tables and ``docs/generated/img/*.png`` plots; see :mod:`simulations.eval.runner`.
"""
