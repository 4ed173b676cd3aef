"""Flower ``ClientApp``: the haarvest agent answering signed rounds over Flower's Message API.

Flower is haarvest's second transport (``pip install 'haarvest[flower]'``). A SuperNode hosts one device (a Pi) or a
*shard* of devices (a gateway, or a virtual SuperNode of a simulation); for every device it runs the SAME
:class:`edge_agent.agent.Agent` — pipeline, privacy ledger, memo table, outbox — as the MQTT agent. Nothing about
privacy changes with the transport:

* the round configuration arrives as the coordinator's signed :class:`protocols.wire.RoundConfig` bytes, exactly as
  published over MQTT, and each device verifies the Ed25519 signature against the coordinator key it was
  provisioned with (the SuperLink and the ServerApp are not trusted);
* the round's ε is clamped to the device's ``privacy.max_round_epsilon`` (or the round is refused, by the device's
  ``round_policy``), and every report is charged in the device's ledger before it leaves (``Agent.report``);
* which streams a device answers, and how, is decided by the one device/coordinator contract of the MQTT agent
  (:meth:`edge_agent.pipeline.Pipeline.round_plans`, :func:`edge_agent.round_contract.plan_for_spec`): the round's
  dims, bounds and labels must be the device's, its mechanism must fit the stream and stay within the device's ε
  (and δ), its rounding steps must be the device's nested grid steps; Haar and longitudinal streams are answered
  like any other. A refused stream is skipped (``spec_<reason>``), the others are answered — the
  same path as MQTT rounds (:func:`edge_agent.rounds.answer_round`: same refusals, same counters);
* replies carry the signed report payloads (topic + bytes) from the device's outbox; the coordinator validates
  them with the same :class:`coordinator.validate.Validator` as MQTT reports.

Messages (``flwr.app.Message``, category ``query``):

``query.round``     request ``{"haarvest": ConfigRecord{"round": bytes, ["t": int]}}`` — the signed round config and,
                    in simulations only, the simulated time step. Reply ``{"haarvest": ConfigRecord{"topics":
                    [str], "payloads": [bytes], <counters>}}``.
``query.announce``  reply ``{"haarvest": ConfigRecord{"device_ids": [str], "public_keys": [str]}}`` — the
                    enrolment of the node's devices (public keys only; the coordinator decides whether to trust it).

Delivery over Flower is at-most-once per reply: reports put in a reply are marked ``sent`` in the outbox (a reply
lost in transit costs ε but never leaks anything) — right after the reply is built, or, on a host that keeps its
agents across rounds (``DeviceShard(defer_sent=True)``: simulations), in the device's next round transaction
(:meth:`Agent.mark_sent_later`), so that a device round costs ONE SQLite commit; reports left ``pending`` by a crash
are sent with the next reply (the coordinator drops exact copies as duplicates).

Which devices a node hosts: a *host factory* installed with :func:`make_client_app` (simulations), else the node
config key ``agent-config`` (one or more agent TOML paths separated by ``,``; ``flower-supernode --node-config
"agent-config='/etc/haarvest/agent.toml'"``).

Many devices per process (a gateway, a simulation host): agents are built once per process and stay open
(:data:`OPEN_AGENTS`; the descriptor limit is raised where allowed, 3 descriptors per open database); beyond the
capacity an agent keeps its pipeline and in-memory state and only its database connection is closed between
rounds. A shard decodes and verifies each round configuration once per coordinator key
(:class:`edge_agent.rounds.RoundCheck`) — the same check every device would make on the same bytes.
"""

from __future__ import annotations

import logging
import resource
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agent import Agent
from .rounds import RoundCheck
from .config import AgentConfig, load_config, load_secrets
from .state import State

__all__ = [
    "ROUND_MESSAGE",
    "ANNOUNCE_MESSAGE",
    "RECORD_KEY",
    "DeviceSpec",
    "DeviceShard",
    "ShardAnswer",
    "raise_fd_limit",
    "make_client_app",
    "app",
]

log = logging.getLogger("haarvest.flower.client")

#: Flower message types (category ``query``, action ``round`` / ``announce``).
ROUND_MESSAGE = "query.round"
ANNOUNCE_MESSAGE = "query.announce"
#: the RecordDict key of haarvest's ConfigRecord in requests and replies.
RECORD_KEY = "haarvest"


# --- a shard of devices --------------------------------------------------------------------------------------


@dataclass
class DeviceSpec:
    """How to build one hosted device: its configuration and a zero-argument source factory (None: the configured
    sources). ``create_identity`` creates the key files on first use (simulations; devices use ``agent enroll``),
    with a ``signature`` report key (``ed25519`` or ``hmac-sha256``, :func:`protocols.wire.generate_device_key`)."""

    config: AgentConfig
    source: Callable[[], Any] | None = None
    create_identity: bool = False
    signature: str = "ed25519"
    #: the device's key in :data:`OPEN_AGENTS` (its state directory)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = str(self.config.state_dir)


@dataclass
class ShardAnswer:
    """A node's reply to one round: signed report payloads and their topics, plus counters."""

    topics: list[str] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topics": self.topics, "payloads": self.payloads}
        out.update({f"n.{k}": int(v) for k, v in self.counters.items()})
        return out


#: descriptors one open agent holds: its SQLite database, the write-ahead log and the WAL index (``-shm``)
FDS_PER_AGENT = 3
#: descriptors of a hosted agent (:class:`State` ``hosted``: exclusive locking, the WAL index in memory, no ``-shm``)
FDS_PER_HOSTED_AGENT = 2
#: descriptors left for everything else in the process (Ray, gRPC, logs, the coordinator store)
FD_RESERVE = 512


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's descriptor limit (``RLIMIT_NOFILE``) towards ``wanted``: the soft limit up to the hard
    one, and the hard one as well where the process may (root). Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft != inf and soft < wanted:
        if hard != inf and hard < wanted:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            except (ValueError, OSError):
                pass
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != inf and soft < wanted:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == inf else min(wanted, hard), hard))
            except (ValueError, OSError):
                pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (1 << 20) if soft == inf else int(soft)


def _fd_budget(per_agent: int = FDS_PER_AGENT) -> int:
    """How many agents this process may keep open under its descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = (1 << 20) if soft == resource.RLIM_INFINITY else int(soft)
    return max(16, (soft - FD_RESERVE) // per_agent)


class _OpenAgents:
    """Process-wide registry of the hosted devices' agents (keyed by state directory).

    An agent is built and opened (:meth:`Agent.open`: state database, boot counter, pipeline) once per process.
    The first ``capacity`` agents keep their state database open across rounds; the others are *suspended* after
    use (:meth:`release`): only their SQLite connection is closed — the agent itself, its pipeline, volatility
    windows and counters stay in memory (every report flushed them to the database already) — and the database is
    reattached on the next use. Rounds visit every device in the same order, so least-recently-used eviction would
    miss on every access once the fleet outgrows the capacity; keeping the first ``capacity`` open hits on that
    many. ``capacity`` is the smaller of the descriptor budget (3 descriptors per open database, 2 when
    ``hosted``) and ``max_open`` (a memory bound: :func:`simulations.flower_sim.default_max_open` plans it from a
    measured footprint per device). ``hosted`` opens the agents' databases as :class:`State` ``hosted`` (exclusive
    locking, small page cache, short WAL): for a process that is the only user of its devices' databases (a
    simulation's shard host); a hosted agent kept open is reattached right after its boot, so that its connection
    holds the statements its rounds use and not those of the boot's ledger checks; a suspended hosted agent's
    database is reattached for one round (:class:`State` ``transient``: exclusive locking and ``synchronous=FULL``
    only — its caller releases it after the round, and closing checkpoints and removes the WAL).
    """

    def __init__(self) -> None:
        self.agents: dict[str, Agent] = {}
        self.resident: set[str] = set()
        self.max_open: int | None = None
        self.hosted = False
        self.capacity = _fd_budget()
        self.opened = 0
        self.reattached = 0

    def configure(self, devices: int | None = None, max_open: int | None = None, hosted: bool | None = None) -> int:
        """Prepare for ``devices`` hosted devices (raising the descriptor limit where allowed), bound the open
        agents by ``max_open`` and set ``hosted`` for agents opened from now on; returns the capacity."""
        if max_open is not None:
            if max_open < 1:
                raise ValueError("max_open must be >= 1")
            self.max_open = int(max_open)
        if hosted is not None:
            self.hosted = bool(hosted)
        per_agent = FDS_PER_HOSTED_AGENT if self.hosted else FDS_PER_AGENT
        if devices is not None:
            want = min(devices, self.max_open or devices)
            raise_fd_limit(want * per_agent + FD_RESERVE)
        self.capacity = min(_fd_budget(per_agent), self.max_open or (1 << 62))
        return self.capacity

    def _open(self, spec: DeviceSpec) -> Agent:
        cfg = spec.config
        if spec.create_identity and not cfg.signing_key_path.exists():
            from .config import create_secrets

            secrets = create_secrets(cfg, signature=spec.signature)
        else:
            secrets = load_secrets(cfg)
        agent = Agent(cfg, source=spec.source() if spec.source is not None else None, secrets=secrets, transport=False,
                      hosted=self.hosted)
        agent.open()
        self.opened += 1
        return agent

    def get(self, spec: DeviceSpec) -> Agent:
        """The device's open agent; call :meth:`release` when done with it."""
        key = spec.key
        agent = self.agents.get(key)
        if agent is None:
            agent = self._open(spec)
            self.agents[key] = agent
            if len(self.resident) < self.capacity:
                self.resident.add(key)
                if self.hosted and agent.state is not None:
                    # drop the statements the boot compiled (ledger checks, boot count, mark): about as much memory
                    # as the connection itself, never used again; the rounds compile theirs on first use
                    agent.state.close()
                    agent.state = State(agent.config.database_path, hosted=True, reattach=True)
        elif agent.state is None:
            self._reattach(agent)
            self.reattached += 1
        return agent

    @staticmethod
    def _reattach(agent: Agent) -> None:
        """A suspended agent's one-round connection (:class:`State` ``transient``)."""
        agent.state = State(agent.config.database_path, hosted=agent.hosted, reattach=True, transient=True)

    def release(self, agent: Agent, key: str | None = None) -> None:
        """Suspend ``agent`` (close its database connection) unless it is one of the agents kept open; ``key``: its
        :attr:`DeviceSpec.key`."""
        key = str(agent.config.state_dir) if key is None else key
        if key not in self.resident and agent.state is not None and self.agents.get(key) is agent:
            agent.state.close()
            agent.state = None

    def close_all(self) -> None:
        """Close every agent (flushing counters and rounding state) and forget them."""
        while self.agents:
            _, agent = self.agents.popitem()
            if agent.state is None and agent.sent_unmarked:  # suspended with marks to write: reattach to write them
                self._reattach(agent)
            agent.close()
        self.resident.clear()


OPEN_AGENTS = _OpenAgents()


class DeviceShard:
    """The devices one SuperNode hosts. Agents stay open across rounds (process-wide, :data:`OPEN_AGENTS`).

    ``before_round(t)`` is called with the message's simulated time step (simulations move their sources' clock).
    ``defer_sent``: the reports a reply carries are marked ``sent`` in each device's next round transaction
    (:meth:`Agent.mark_sent_later`: one commit per device round) instead of one transaction of their own right after
    the reply is built. Only for a host whose process keeps its agents across rounds (a simulation's shard host): the
    marks live in memory until then, and a process that ends first leaves those reports ``pending``, to be sent
    again with the next reply (the coordinator drops the copies as duplicates; nothing is charged twice).
    """

    def __init__(self, devices: Sequence[DeviceSpec], before_round: Callable[[int], None] | None = None,
                 max_reports_per_device: int = 1000, defer_sent: bool = False) -> None:
        if not devices:
            raise ValueError("a shard needs at least one device")
        ids = [d.config.device_id for d in devices]
        if len(set(ids)) != len(ids):
            raise ValueError("device ids in a shard must be distinct")
        self.devices = list(devices)
        self.before_round = before_round
        self.max_reports_per_device = int(max_reports_per_device)
        self.defer_sent = bool(defer_sent)

    def agents(self) -> list[Agent]:
        """Every hosted device's open agent (kept open beyond the descriptor budget: small shards and tests; a
        suspended agent's one-round connection stays open until :meth:`_OpenAgents.release` or ``close_all``)."""
        return [OPEN_AGENTS.get(d) for d in self.devices]

    def announce(self) -> tuple[list[str], list[str]]:
        """(device ids, registry entries) of the hosted devices (creating identities where asked): the base64
        Ed25519 public key, or for an ``hmac-sha256`` device its report key (:attr:`Secrets.public_key_b64`)."""
        ids, keys = [], []
        for spec in self.devices:
            agent = OPEN_AGENTS.get(spec)
            ids.append(agent.config.device_id)
            keys.append(agent.secrets.public_key_b64)
            OPEN_AGENTS.release(agent)
        return ids, keys

    def answer(self, round_payload: bytes, t: int | None = None) -> ShardAnswer:
        """Every hosted device answers the round (or refuses it); the reply carries each device's pending reports.
        The round configuration is decoded and verified once per coordinator key for the shard (:class:`RoundCheck`).
        """
        if self.before_round is not None and t is not None:
            self.before_round(int(t))
        out = ShardAnswer()
        check = RoundCheck()
        for spec in self.devices:
            agent = OPEN_AGENTS.get(spec)
            status, outcome = agent.answer_round(round_payload, check=check)
            out.counters[f"status.{status}"] += 1
            if outcome is not None:
                out.counters["charged_reports"] += sum(1 for c in outcome.commits if not c.memo_hit)
                out.counters["memo_hits"] += sum(1 for c in outcome.commits if c.memo_hit)
                for _, reason in outcome.refused:
                    out.counters[f"refused.{reason}"] += 1
            agent.flush_sent()  # rows of the last reply not yet marked (no report transaction this round)
            if outcome is not None and outcome.backlog == 0:  # the round's commits are all the outbox holds pending
                rows = [(c.seq, c.topic, c.payload) for c in outcome.commits[: self.max_reports_per_device]]
            else:  # older pending rows (a crash, a refused round, a reply limit): the outbox decides
                state = agent.state
                assert state is not None
                rows = [(r.seq, r.topic, r.payload) for r in state.pending(limit=self.max_reports_per_device)]
            if rows:
                for _, topic, payload in rows:
                    out.topics.append(topic)
                    out.payloads.append(payload)
                if self.defer_sent:
                    agent.mark_sent_later([seq for seq, _, _ in rows])  # in the device's next transaction
                else:
                    assert agent.state is not None
                    agent.state.mark_sent([seq for seq, _, _ in rows])
            OPEN_AGENTS.release(agent, spec.key)
        out.counters["devices"] = len(self.devices)
        return out


# --- the ClientApp -------------------------------------------------------------------------------------------

HostFactory = Callable[[Mapping[str, Any]], DeviceShard]
_HOSTS: dict[Any, DeviceShard] = {}


def _config_host(node_config: Mapping[str, Any]) -> DeviceShard:
    """Deployment: the devices named by node config ``agent-config`` (agent TOML paths separated by ``,``)."""
    paths = str(node_config.get("agent-config", "")).strip()
    if not paths:
        raise ValueError("this SuperNode has no haarvest devices: set --node-config \"agent-config='<agent.toml>'\"")
    key = ("config", paths)
    host = _HOSTS.get(key)
    if host is None:
        host = DeviceShard([DeviceSpec(load_config(Path(p.strip()))) for p in paths.split(",") if p.strip()])
        OPEN_AGENTS.configure(devices=sum(len(h.devices) for h in _HOSTS.values()) + len(host.devices))
        _HOSTS[key] = host
    return host


def make_client_app(host_factory: HostFactory | None = None) -> Any:
    """A Flower ``ClientApp`` answering ``query.round`` and ``query.announce``.

    ``host_factory(node_config) -> DeviceShard`` picks the node's devices (simulations pass a picklable factory: the
    app is shipped to simulation workers); None reads the node config key ``agent-config``. A factory should cache
    its shards (workers call it for every message).
    """
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp

    client_app = ClientApp()

    def host_for(context: Context) -> DeviceShard:
        node_config = dict(context.node_config)
        return host_factory(node_config) if host_factory is not None else _config_host(node_config)

    @client_app.query("round")
    def round_query(msg: Message, context: Context) -> Message:
        record = msg.content[RECORD_KEY]
        payload = record["round"]
        if not isinstance(payload, bytes):
            raise ValueError("query.round needs the signed round configuration as bytes under 'round'")
        t = record.get("t")
        answer = host_for(context).answer(payload, int(t) if t is not None else None)
        return Message(RecordDict({RECORD_KEY: ConfigRecord(answer.to_record())}), reply_to=msg)

    @client_app.query("announce")
    def announce_query(msg: Message, context: Context) -> Message:
        ids, keys = host_for(context).announce()
        return Message(RecordDict({RECORD_KEY: ConfigRecord({"device_ids": ids, "public_keys": keys})}), reply_to=msg)

    return client_app


def __getattr__(name: str) -> Any:
    # ``app`` (the deployment ClientApp, referenced as ``edge_agent.flower_app:app``) is built on first access so
    # importing this module does not need flwr.
    if name == "app":
        value = make_client_app()
        globals()["app"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
