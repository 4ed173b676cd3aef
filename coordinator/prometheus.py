"""Prometheus metrics of the coordinator (``GET /metrics``, the Prometheus text format via ``prometheus-client``).

An operator scrapes them with the API token (``authorization: {credentials_file: …/api-token}`` in the scrape
config) and puts the fleet's private statistics beside the rest of their monitoring; ``deploy/grafana/`` ships a
dashboard for them. Families (all read at scrape time; nothing is kept twice):

* ``haarvest_ingest_{received,accepted,duplicates}_total``, ``haarvest_ingest_rejected_total{reason}`` — this
  process's ingest counters; ``haarvest_ingest_connected`` (1 while the broker session is up);
* ``haarvest_device_rejected_total{device,reason}`` — durable per-device rejection counters (only devices that
  had one), ``haarvest_device_quarantined{device}`` (1 per quarantined device), ``haarvest_devices{status}``;
* ``haarvest_round_open{round}``, ``haarvest_round_reports{round,stream}`` — round progress of the open rounds and
  the :data:`RECENT_ROUNDS` most recently opened (a bounded set of series however many rounds a fleet has run);
  ``haarvest_rounds{status}`` — how many rounds there are by status;
* ``haarvest_estimate{stream,label,round}`` with ``haarvest_estimate_ci_low`` / ``haarvest_estimate_ci_high`` —
  the latest round's estimate of every stream (the newest round that has the stream and at least one report) and
  its confidence interval (level in ``haarvest_estimate_level``), taken from the API's throttled cache
  (:meth:`coordinator.api.ApiServer.estimates`), so a scrape never costs more than a dashboard refresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:  # pragma: no cover
    from coordinator.api import ApiServer

__all__ = ["FleetCollector", "render", "CONTENT_TYPE_LATEST", "RECENT_ROUNDS", "labelled_rounds"]

#: Rounds with series of their own besides the open ones: the most recently opened (issue 37: every round ever opened
#: stayed a labelled series, so a fleet with hourly rounds grew 8,760 series a year per stream).
RECENT_ROUNDS = 24


def labelled_rounds(rounds: list[dict[str, Any]], recent: int = RECENT_ROUNDS) -> list[dict[str, Any]]:
    """The rounds (in opening order) that get labelled series: every open one and the ``recent`` last opened."""
    keep = {id(r) for r in rounds[-recent:]} if recent > 0 else set()
    return [r for r in rounds if r["status"] == "open" or id(r) in keep]


class FleetCollector(Collector):
    """Collects the coordinator's metrics from an :class:`coordinator.api.ApiServer` (its store connection)."""

    def __init__(self, api: "ApiServer") -> None:
        self.api = api

    def collect(self) -> Iterator[Metric]:
        api, coord = self.api, self.api.coordinator
        snap = coord.metrics.snapshot()
        for name in ("received", "accepted", "duplicates"):
            yield CounterMetricFamily(f"haarvest_ingest_{name}", f"reports {name} by this process's ingest",
                                      value=snap[name])
        rejected = CounterMetricFamily("haarvest_ingest_rejected", "messages rejected by this process, by reason",
                                       labels=["reason"])
        for reason, n in sorted(snap["rejected"].items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield GaugeMetricFamily("haarvest_ingest_connected", "1 while the ingest's broker session is up",
                                value=1.0 if snap["connected"] else 0.0)

        store = api.store
        quarantined = GaugeMetricFamily("haarvest_device_quarantined", "1 for each quarantined device",
                                        labels=["device"])
        for device, status in sorted(store.device_statuses().items()):
            if status == "quarantined":
                quarantined.add_metric([device], 1.0)
        yield quarantined
        devices = GaugeMetricFamily("haarvest_devices", "enrolled devices by status", labels=["status"])
        for status, n in sorted(store.device_status_counts().items()):
            devices.add_metric([status], n)
        yield devices
        per_device = CounterMetricFamily("haarvest_device_rejected", "durable rejection counts per device and reason",
                                         labels=["device", "reason"])
        for device, counts in sorted(store.device_counters().items()):
            for reason, n in sorted(counts.items()):
                if reason != "quarantined":
                    per_device.add_metric([device, reason], n)
        yield per_device

        rounds = api.rounds.list()
        counts = store.report_counts()
        round_open = GaugeMetricFamily("haarvest_round_open", "1 while a round is open", labels=["round"])
        reports = GaugeMetricFamily("haarvest_round_reports", "stored reports per round and stream",
                                    labels=["round", "stream"])
        by_status = GaugeMetricFamily("haarvest_rounds", "rounds by status", labels=["status"])
        for status in sorted({r["status"] for r in rounds}):
            by_status.add_metric([status], sum(1 for r in rounds if r["status"] == status))
        for r in labelled_rounds(rounds):
            round_open.add_metric([r["round_id"]], 1.0 if r["status"] == "open" else 0.0)
            for stream in r["streams"]:
                reports.add_metric([r["round_id"], stream], counts.get((r["round_id"], stream), 0))
        yield round_open
        yield reports
        yield by_status
        yield from self._estimates(rounds, counts)

    def _estimates(self, rounds: list[dict[str, Any]], counts: dict[tuple[str, str], int]) -> Iterator[Metric]:
        latest: dict[str, str] = {}
        for r in rounds:  # opening order: the last one with reports wins
            for stream in r["streams"]:
                if counts.get((r["round_id"], stream)):
                    latest[stream] = r["round_id"]
        names = {"estimate": "the latest round's estimate of each stream",
                 "ci_low": "lower bound of the estimate's confidence interval",
                 "ci_high": "upper bound of the estimate's confidence interval"}
        families = {k: GaugeMetricFamily(f"haarvest_estimate{'' if k == 'estimate' else '_' + k}", text,
                                         labels=["stream", "label", "round"]) for k, text in names.items()}
        level = GaugeMetricFamily("haarvest_estimate_level", "confidence level of the intervals", labels=["stream"])
        qnames = {"value": "the latest round's quantile estimate of each distribution stream",
                  "low": "lower bound of the quantile's interval (distribution streams with an analytic variance)",
                  "high": "upper bound of the quantile's interval (distribution streams with an analytic variance)"}
        quantiles = {k: GaugeMetricFamily(f"haarvest_estimate_quantile{'' if k == 'value' else '_' + k}", text,
                                          labels=["stream", "q", "round"]) for k, text in qnames.items()}
        by_round: dict[str, dict[str, Any]] = {}
        for stream, rid in sorted(latest.items()):
            if rid not in by_round:
                by_round[rid] = self.api.estimates(rid)
            est = by_round[rid].get(stream)
            if not est or est.get("error"):
                continue
            for i, label in enumerate(est["labels"]):
                for key, fam in families.items():
                    if i < len(est[key]):  # Square Wave distributions have no histogram interval
                        fam.add_metric([stream, str(label), rid], float(est[key][i]))
            for q in est.get("quantiles") or []:
                for key, fam in quantiles.items():
                    if q.get(key) is not None:
                        fam.add_metric([stream, format(float(q["q"]), "g"), rid], float(q[key]))
            level.add_metric([stream], float(est["level"]))
        yield from families.values()
        yield from quantiles.values()
        yield level


def render(api: "ApiServer") -> bytes:
    """The metrics in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(api))
    return generate_latest(registry)
