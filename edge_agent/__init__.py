"""haarvest edge agent: the daemon on every device (sources → LDP pipeline → durable ledger/outbox → MQTT).

Public API: :class:`edge_agent.agent.Agent`, :func:`edge_agent.agent.run_fleet`,
:func:`edge_agent.config.load_config` / :func:`~edge_agent.config.parse_config`, :mod:`edge_agent.sources`,
:mod:`edge_agent.embed` (configs and identities in code). See docs/agent.md.
"""

import logging as _logging

from protocols.errors import ConfigError

from .agent import Agent, ReportOutcome, run_fleet
from .config import AgentConfig, Secrets, load_config, load_secrets, parse_config

__all__ = [
    "Agent",
    "ReportOutcome",
    "run_fleet",
    "AgentConfig",
    "ConfigError",
    "Secrets",
    "load_config",
    "load_secrets",
    "parse_config",
]

_logging.getLogger("haarvest").addHandler(_logging.NullHandler())
