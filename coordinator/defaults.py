"""The default values of the coordinator's options, declared once.

:class:`coordinator.run_config.RunOptions` (``haarvest coordinator run`` and its config file),
:class:`coordinator.service.CoordinatorConfig` (the library entry point) and
:class:`coordinator.mqtt_receiver.IngestSettings` (the MQTT receiver process, which imports no more than it needs:
hence plain constants here) take their defaults from this module.
"""

from __future__ import annotations

DB = "haarvest-coordinator.db"  # the SQLite database
KEY = "coordinator.key"  # the round-signing key file
MQTT_HOST = "127.0.0.1"
MQTT_PORT = 1883
CLIENT_ID = "haarvest-coordinator"  # MQTT client id of the ingest's persistent session
BATCH_SIZE = 1000  # reports per ingest batch
BATCH_MS = 20.0  # an ingest batch waits at most this long
MQTT_PROTOCOL = "5"  # "5", "3.1.1" or "auto"
HTTP_HOST = "127.0.0.1"  # address of the HTTP API and dashboard
FLOOD_MAX_MESSAGES = 2000  # flood quarantine: messages per device and window (0: no limit)
FLOOD_MAX_REJECTIONS = 500  # flood quarantine: rejections per device and window (0: no limit)
FLOOD_WINDOW_S = 60.0  # the flood window, seconds
BROKER_QUARANTINE = True  # cut quarantined devices off at the broker
