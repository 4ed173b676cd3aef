"""Flower ``ServerApp``: haarvest collection rounds over Flower's Message API (the second transport).

The loop is the MQTT coordinator's, with Flower's Grid in place of the broker:

1. (optional) ``query.announce`` asks every node for its devices' public keys and enrols them — trust on first
   use, for simulations and closed test beds only; production enrols from the device registry (``devices-file`` or
   the store), exactly as for MQTT.
2. For round r the :class:`coordinator.rounds.RoundManager` signs a :class:`protocols.wire.RoundConfig`: round 1
   from the base parameters, round r ≥ 2 by the planners (:func:`coordinator.rounds.plan_round`: α-rounding steps
   from the volatility of the published means, heavy-hitter prefix extension) from the estimates of rounds 1..r-1 —
   sequentially interactive (SPEC §5), computed only from published aggregates (post-processing; adaptive
   composition, SPEC §4). ``depends_on`` names those rounds.
3. The signed bytes go to every node in a ``query.round`` message; replies are pulled as they arrive until all nodes
   answered or ``timeout`` seconds passed (stragglers are dropped from the round: their later replies are never
   pulled; TTL = timeout + margin so they expire at the SuperLink).
4. Every report in a reply goes through :class:`coordinator.validate.Validator` (size, schema, topic/device binding,
   enrolled, signature — Ed25519 or HMAC-SHA256 as the device's registry entry says — round open, stream/mechanism,
   body, replay/duplicate) and each reply's accepted reports are committed in one store transaction — the same code
   path as the MQTT ingest: a reply is one :meth:`Validator.check_batch` (the body support checks of its rows run
   once per stream on the stacked rows; verdicts identical to checking the messages one by one).
5. The round is closed and estimated with :func:`coordinator.estimate.estimate_round` (unbiased estimates, confidence
   intervals from the mechanisms' variance formulas).

Deployment: ``app`` (referenced as ``coordinator.flower_app:app``) reads the run config keys listed in
:func:`settings_from_run_config`; see deploy/flower/README.md. Simulation: :func:`make_server_app` wraps an existing
:class:`FlowerCoordinator` (simulations/flower_sim.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.estimate import StreamEstimate, estimate_round
from coordinator.rounds import RoundManager
from protocols.contract import parse_round_params
from coordinator.store import Store, StoredReport
from coordinator.validate import DUPLICATE, Validator, per_device_counters
from protocols import wire

__all__ = [
    "ROUND_MESSAGE",
    "ANNOUNCE_MESSAGE",
    "RECORD_KEY",
    "FlowerSettings",
    "RoundSummary",
    "FlowerCoordinator",
    "settings_from_run_config",
    "make_server_app",
    "app",
]

log = logging.getLogger("haarvest.flower.server")

ROUND_MESSAGE = "query.round"
ANNOUNCE_MESSAGE = "query.announce"
RECORD_KEY = "haarvest"
#: seconds added to the per-round timeout for a request's time-to-live at the SuperLink
TTL_MARGIN = 30.0


@dataclass
class FlowerSettings:
    """What one Flower run of the coordinator does.

    ``base_params`` is a :class:`protocols.contract.RoundParams` (as JSON) for round 1 and the template the planners
    update for later rounds; ``epsilon`` is the most one device may spend per round (devices clamp it to their own
    maximum). ``timeout`` cuts stragglers off; ``min_nodes``/``node_wait``: wait up to ``node_wait`` seconds for
    that many nodes before round 1. ``send_time``: put the round index in each request as the simulated time step
    (simulations only). ``planner`` is passed to :func:`coordinator.rounds.plan_round` (``k_base``, ``eta``, ``z``,
    ``max_candidates``). Replies are polled every ``pull_interval`` seconds after a reply arrived, backing off
    (doubling) up to ``pull_max_interval`` while none does.
    """

    base_params: dict[str, Any]
    rounds: int = 2
    epsilon: float = 1.0
    round_prefix: str = "flower"
    timeout: float = 120.0
    min_nodes: int = 1
    node_wait: float = 60.0
    enroll: Literal["registry", "announce"] = "registry"
    level: float = 0.95
    send_time: bool = False
    stream_replies: bool = True
    pull_interval: float = 0.02
    pull_max_interval: float = 0.1
    planner: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("rounds must be >= 1")
        if not (self.epsilon > 0 and self.timeout > 0 and self.node_wait >= 0 and self.min_nodes >= 1):
            raise ValueError("need epsilon > 0, timeout > 0, node_wait >= 0 and min_nodes >= 1")
        if not (self.pull_interval > 0 and self.pull_max_interval > 0):
            raise ValueError("pull_interval and pull_max_interval must be > 0")
        if self.enroll not in ("registry", "announce"):
            raise ValueError("enroll must be 'registry' or 'announce'")
        if not 0 < self.level < 1:
            raise ValueError("level must lie in (0, 1)")
        parse_round_params(self.base_params)


@dataclass
class RoundSummary:
    """What happened in one round: who answered, what was accepted or rejected (by reason), and the estimates."""

    round_id: str
    config: wire.RoundConfig
    nodes_asked: int = 0
    nodes_replied: int = 0
    node_errors: int = 0
    reports: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    device_counters: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    seconds_collect: float = 0.0
    seconds_ingest: float = 0.0
    cpu_ingest: float = 0.0
    cpu_process: float = 0.0
    seconds_estimate: float = 0.0
    estimates: dict[str, StreamEstimate] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "round_id": self.round_id,
            "epsilon": self.config.epsilon,
            "depends_on": list(self.config.depends_on),
            "params": self.config.params,
            "nodes_asked": self.nodes_asked,
            "nodes_replied": self.nodes_replied,
            "node_errors": self.node_errors,
            "reports": self.reports,
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "device_counters": dict(self.device_counters),
            "seconds": self.seconds,
            "seconds_collect": self.seconds_collect,
            "seconds_ingest": self.seconds_ingest,
            "cpu_ingest": self.cpu_ingest,
            "cpu_process": self.cpu_process,
            "seconds_estimate": self.seconds_estimate,
            "estimates": {k: v.to_dict() for k, v in self.estimates.items()},
        }


class FlowerCoordinator:
    """Runs haarvest rounds over a Flower ``Grid`` against a coordinator store (see the module docstring)."""

    def __init__(self, store: Store, key: Ed25519PrivateKey, settings: FlowerSettings,
                 validator: Validator | None = None) -> None:
        self.store = store
        self.settings = settings
        self.validator = validator or Validator(store)
        self.rounds = RoundManager(store, key, publish=None, on_change=self.validator.set_round)
        self.summaries: list[RoundSummary] = []

    @property
    def public_key(self) -> str:
        return self.rounds.public_key

    # ------------------------------------------------------------------ nodes and enrolment
    def wait_for_nodes(self, grid: Any) -> list[int]:
        """Node ids once ``min_nodes`` are connected (or whatever is there after ``node_wait`` seconds)."""
        deadline = time.monotonic() + self.settings.node_wait
        while True:
            nodes = sorted(int(n) for n in grid.get_node_ids())
            if len(nodes) >= self.settings.min_nodes or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not nodes:
            raise RuntimeError("no Flower nodes connected")
        if len(nodes) < self.settings.min_nodes:
            log.warning("only %d of %d nodes connected", len(nodes), self.settings.min_nodes)
        return nodes

    def announce(self, grid: Any, nodes: Sequence[int]) -> int:
        """Enrol the devices the nodes announce (trust on first use); returns how many were enrolled."""
        from flwr.app import ConfigRecord, RecordDict

        msgs = [self._message(grid, RecordDict({RECORD_KEY: ConfigRecord({})}), ANNOUNCE_MESSAGE, n, "announce")
                for n in nodes]
        n_enrolled = 0
        for reply in self._collect(grid, msgs):
            if reply.has_error():
                log.warning("announce failed on node %s: %s", reply.metadata.src_node_id, reply.error.reason)
                continue
            rec = reply.content[RECORD_KEY]
            for device_id, pub in zip(rec["device_ids"], rec["public_keys"]):
                wire.load_registry_key(str(pub))  # Ed25519 public key or HMAC report key; ValueError if neither
                self.store.upsert_device(str(device_id), str(pub))
                n_enrolled += 1
        self.validator.refresh_devices()
        return n_enrolled

    # ------------------------------------------------------------------ rounds
    def round_id(self, index: int) -> str:
        return f"{self.settings.round_prefix}-r{index + 1}"

    def open_round(self, index: int) -> wire.RoundConfig:
        """Round ``index`` (0-based): base parameters first, then planned from the earlier rounds' estimates."""
        s = self.settings
        history = [(summary.round_id, summary.estimates) for summary in self.summaries]
        if not history:
            return self.rounds.open_round(self.round_id(index), s.epsilon, s.base_params, protocol="flower")
        return self.rounds.open_next_round(self.round_id(index), s.epsilon, s.base_params, history,
                                           protocol="flower-adaptive", **s.planner)

    def run(self, grid: Any) -> list[RoundSummary]:
        """Enrol (if asked), then run ``settings.rounds`` rounds; returns their summaries."""
        _preload_estimation()
        nodes = self.wait_for_nodes(grid)
        if self.settings.enroll == "announce":
            n = self.announce(grid, nodes)
            log.info("enrolled %d announced devices from %d nodes", n, len(nodes))
        for index in range(self.settings.rounds):
            self.run_round(grid, index, nodes)
        return self.summaries

    def run_round(self, grid: Any, index: int, nodes: Sequence[int] | None = None) -> RoundSummary:
        from flwr.app import ConfigRecord, RecordDict

        t0, cpu0 = time.perf_counter(), time.process_time()
        nodes = list(nodes) if nodes is not None else sorted(int(n) for n in grid.get_node_ids())
        config = self.open_round(index)
        summary = RoundSummary(round_id=config.round_id, config=config, nodes_asked=len(nodes))
        payload = config.to_bytes()
        content: dict[str, Any] = {"round": payload}
        if self.settings.send_time:
            content["t"] = int(index)
        msgs = [self._message(grid, RecordDict({RECORD_KEY: ConfigRecord(dict(content))}), ROUND_MESSAGE, n,
                              config.round_id) for n in nodes]
        t_sent = time.perf_counter()
        for reply in self._collect(grid, msgs):
            self._ingest_reply(reply, summary)
        summary.seconds_collect = time.perf_counter() - t_sent
        t_closed = time.perf_counter()
        self.rounds.close_round(config.round_id)
        summary.estimates = estimate_round(self.store, config.round_id, level=self.settings.level)
        summary.seconds_estimate = time.perf_counter() - t_closed
        summary.seconds = time.perf_counter() - t0
        summary.cpu_process = time.process_time() - cpu0
        self.summaries.append(summary)
        log.info("round %s: %d/%d nodes, %d reports accepted, rejected %s, %.2f s", config.round_id,
                 summary.nodes_replied, summary.nodes_asked, summary.accepted, dict(summary.rejected), summary.seconds)
        return summary

    # ------------------------------------------------------------------ plumbing
    def _message(self, grid: Any, content: Any, message_type: str, node: int, group: str) -> Any:
        from flwr.app import Message

        return Message(content, int(node), message_type, ttl=self.settings.timeout + TTL_MARGIN, group_id=group)

    def _collect(self, grid: Any, messages: list[Any]) -> Iterable[Any]:
        """Replies as they arrive, until all came or ``timeout`` passed (``send_and_receive`` semantics; streaming
        lets the validation of early replies overlap the devices' work on later ones)."""
        timeout = self.settings.timeout
        if not self.settings.stream_replies:
            yield from grid.send_and_receive(messages, timeout=timeout)
            return
        waiting = set(grid.push_messages(messages))
        deadline = time.monotonic() + timeout
        pause = self.settings.pull_interval
        while waiting and time.monotonic() < deadline:
            replies = list(grid.pull_messages(list(waiting)))
            for reply in replies:
                waiting.discard(reply.metadata.reply_to_message_id)
                yield reply
            if replies:
                pause = self.settings.pull_interval
            else:  # back off while nothing arrives: a poll asks about every waiting message (costly for many nodes)
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(2 * pause, max(self.settings.pull_interval, self.settings.pull_max_interval))
        if waiting:
            log.warning("%d nodes did not answer within %.1f s (stragglers dropped)", len(waiting), timeout)

    def _ingest_reply(self, reply: Any, summary: RoundSummary) -> None:
        if reply.has_error():
            summary.node_errors += 1
            log.warning("node %s failed: %s", reply.metadata.src_node_id, reply.error.reason)
            return
        summary.nodes_replied += 1
        rec = reply.content[RECORD_KEY]
        for key, value in rec.items():
            if key.startswith("n.") and isinstance(value, int):
                summary.device_counters[key[2:]] += value
        topics, payloads = list(rec.get("topics", [])), list(rec.get("payloads", []))
        if len(topics) != len(payloads):
            summary.rejected["malformed_reply"] += len(payloads)
            return
        t, cpu = time.perf_counter(), time.thread_time()
        accepted, counters = self.ingest(topics, payloads)
        summary.seconds_ingest += time.perf_counter() - t
        summary.cpu_ingest += time.thread_time() - cpu
        summary.reports += len(payloads)
        summary.accepted += accepted
        summary.rejected.update(counters)

    def ingest(self, topics: Sequence[str], payloads: Sequence[bytes]) -> tuple[int, Counter[str]]:
        """Validate signed reports and commit the accepted ones in one transaction: (stored, rejected by reason)."""
        accepted: list[StoredReport] = []
        rejected: Counter[str] = Counter()
        results = self.validator.check_batch([(str(t), bytes(p)) for t, p in zip(topics, payloads)])
        for result in results:
            if isinstance(result, wire.WireError):
                rejected[result.reason] += 1
            else:
                accepted.append(result)
        try:
            inserted = self.store.commit_batch(accepted, {**rejected, **per_device_counters(results)},
                                               self.validator.statistics)
        except Exception:
            self.validator.reload()
            raise
        self.validator.batch_committed()
        if inserted < len(accepted):
            rejected[DUPLICATE] += len(accepted) - inserted
        return inserted, rejected


def _preload_estimation() -> None:
    """Import what the estimates need (scipy.stats for confidence intervals, a slow import) before round 1 rather than
    inside it."""
    try:
        importlib.import_module("scipy.stats")
    except ImportError:  # pragma: no cover - scipy is a dependency; the estimates report the error if not
        pass


# ---------------------------------------------------------------------- apps


def make_server_app(coordinator: FlowerCoordinator, on_done: Callable[[list[RoundSummary]], None] | None = None) -> Any:
    """A ``ServerApp`` whose ``main`` runs ``coordinator`` (simulations and tests build the coordinator in-process)."""
    from flwr.serverapp import ServerApp

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        summaries = coordinator.run(grid)
        if on_done is not None:
            on_done(summaries)

    return server_app


def settings_from_run_config(run_config: Mapping[str, Any]) -> tuple[FlowerSettings, dict[str, Any]]:
    """Settings and deployment options from a Flower run config (``flwr run … --run-config``; pyproject
    ``[tool.flwr.app.config]``). Keys: ``params-file`` (JSON RoundParams; required), ``rounds``, ``epsilon``,
    ``timeout``, ``min-nodes``, ``node-wait``, ``enroll`` (registry | announce), ``round-prefix``, ``level``,
    ``db`` (store URL), ``key-file`` (coordinator signing key), ``devices-file`` (enrolment JSON), ``out``
    (results JSON written at the end)."""
    params_file = run_config.get("params-file")
    if not params_file:
        raise ValueError("run config needs params-file (JSON round parameters)")
    base = json.loads(Path(str(params_file)).read_text())
    settings = FlowerSettings(
        base_params=base,
        rounds=int(run_config.get("rounds", 2)),
        epsilon=float(run_config.get("epsilon", 1.0)),
        timeout=float(run_config.get("timeout", 120.0)),
        min_nodes=int(run_config.get("min-nodes", 1)),
        node_wait=float(run_config.get("node-wait", 60.0)),
        enroll=str(run_config.get("enroll", "registry")),  # type: ignore[arg-type]
        round_prefix=str(run_config.get("round-prefix", f"flower-{int(time.time())}")),
        level=float(run_config.get("level", 0.95)),
    )
    options = {k: run_config.get(k) for k in ("db", "key-file", "devices-file", "out")}
    return settings, options


def _deployment_main(grid: Any, context: Any) -> None:
    from coordinator.service import load_or_create_key, read_device_records
    from coordinator.store import open_store

    settings, options = settings_from_run_config(dict(context.run_config))
    store = open_store(str(options.get("db") or "haarvest-flower.db"))
    try:
        if options.get("devices-file"):
            for rec in read_device_records(str(options["devices-file"])):
                store.upsert_device(rec.device_id, rec.public_key, contract=rec.contract)
        key = load_or_create_key(options.get("key-file") or None)
        coordinator = FlowerCoordinator(store, key, settings)
        summaries = coordinator.run(grid)
        if options.get("out"):
            Path(str(options["out"])).write_text(json.dumps([s.to_dict() for s in summaries], indent=1))
    finally:
        store.close()


def __getattr__(name: str) -> Any:
    # ``app`` (``coordinator.flower_app:app``) is built on first access so importing this module does not need flwr.
    if name == "app":
        from flwr.serverapp import ServerApp

        server_app = ServerApp()
        server_app.main()(_deployment_main)
        globals()["app"] = server_app
        return server_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
