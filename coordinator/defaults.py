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
#: reports per ingest batch, at most. A batch closes by age (BATCH_MS) only while the coordinator has room for it, so
#: batches reach this size only under load (group commit): a commit writes every index page its reports touched, and
#: reports in random device order touch about one page each per device-keyed index until batches are large (the
#: "Fleet scale" section of ``make bench``).
BATCH_SIZE = 10_000
#: MQTT 5 Receive Maximum the ingest receiver asks for: the broker's in-flight window, room for the batches awaiting
#: their commit (coordinator.mqtt_receiver.MAX_BATCHES_IN_FLIGHT, 3) and one filling. The shipped broker's
#: ``max_inflight_messages`` (deploy/mosquitto/haarvest.conf) gives MQTT 3.1.1 sessions the same window.
RECEIVE_MAXIMUM = 40_000
BATCH_MS = 20.0  # an ingest batch waits at most this long
MQTT_PROTOCOL = "5"  # "5", "3.1.1" or "auto"
HTTP_HOST = "127.0.0.1"  # address of the HTTP API and dashboard
FLOOD_MAX_MESSAGES = 2000  # flood quarantine: messages per device and window (0: no limit)
FLOOD_MAX_REJECTIONS = 500  # flood quarantine: rejections per device and window (0: no limit)
FLOOD_WINDOW_S = 60.0  # the flood window, seconds
BROKER_QUARANTINE = True  # cut quarantined devices off at the broker
