"""haarvest — telemetry from edge fleets under local differential privacy (command-line entry point)."""

__version__ = "0.1.0"
