"""The agent's configuration: one TOML file, environment overrides, secrets read from files.

Layout (see ``docs/agent.md`` for a complete example)::

    device_id = "pi-0001"
    state_dir = "/var/lib/haarvest"
    coordinator_public_key_file = "/etc/haarvest/coordinator.pub"

    [privacy]            # defaults for every stream, and the device's own limit on what a round may ask
    epsilon = 1.0
    unit = "device"                 # the privacy unit the ledger's number is true for (or "value")
    max_round_epsilon = 4.0
    round_policy = "clamp"          # or "refuse"

    [ledger]
    total_cap = 200.0
    stream_cap = 50.0
    renewal_period_s = 2592000      # optional: caps apply to any sliding window of this length
    # delta_cap = 1e-6              # required only by (ε, δ) mechanisms (gaussian): the most Σδ per window

    [[dimensions]]
    name = "cpu"
    kind = "numeric"
    lo = 0.0
    hi = 100.0
    source = "cpu_percent"

    [[streams]]
    name = "cpu"
    dimensions = ["cpu"]
    mechanism = "auto"

    [[sources]]
    kind = "system"

    [mqtt]
    host = "broker.local"

Environment overrides: ``HAARVEST_AGENT__SECTION__KEY=value`` sets ``[section] key`` (``HAARVEST_AGENT__KEY`` a
top-level key, a numeric part indexes a list: ``HAARVEST_AGENT__DIMENSIONS__0__HI=80``). Values are parsed as
TOML literals when they are one (``4``, ``1.5``, ``true``, ``["a"]``), else taken as strings.

**Privacy units** (``privacy.unit``, per stream ``unit``). The ledger's total is a rigorous upper bound for the unit
the stream names:

* ``device`` (the default): the total over a budget window bounds the log-likelihood ratio of *everything* the
  device released in that window against *any* other sequence of readings (user-level LDP). Every report is a
  fresh randomization charged its ε; nothing is memoized (a re-sent memoized report would reveal when a value
  changes, which no per-value charge covers). Longitudinal chains (``lgrr``, ``loloha``) are charged their IRR's
  ε for an arbitrary change of its input per report (``irr_input_epsilon``: the PRR table is data-independent, so
  conditioned on it the reports are independent IRRs). ``ddrm`` streams (change-bounded, see
  :mod:`edge_agent.pipeline`) are charged by the number of tree nodes released, up to their change budget.
* ``value`` (opt-in, RAPPOR-style memoization): a memo hit costs 0 and a new memo entry its ε (ε∞); the total
  bounds the loss about each distinct value, *not* when values change (``agent status`` says what it does not
  hide, per stream).

Secrets are never in the TOML file: the device's Ed25519 signing key and the HMAC memo secret live in their own
files (mode 0600, created by ``haarvest agent enroll``) and are read by :func:`load_secrets`.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocols import wire
from protocols.contract import AUTO
from protocols.errors import ConfigError
from protocols.toml_file import read_toml

__all__ = [
    "ConfigError",
    "DimensionConfig",
    "StreamConfig",
    "SourceConfig",
    "PrivacyConfig",
    "LedgerConfig",
    "PrivacyUnit",
    "MqttConfig",
    "AgentConfig",
    "Secrets",
    "ENV_PREFIX",
    "load_config",
    "parse_config",
    "apply_env_overrides",
    "load_secrets",
    "format_validation_error",
]

ENV_PREFIX = "HAARVEST_AGENT__"
Ident = wire.Ident


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite(value: float | None, name: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


class RoundingConfig(_Model):
    """Volatility detection and adaptive α-point rounding parameters (SPEC §2.1–2.2)."""

    enabled: bool = True
    window: int = Field(16, ge=2, le=4096, description="W: sliding-window length (readings, RAM only)")
    tau: float = Field(0.01, ge=0.0, lt=1.0, description="volatility threshold on the window score")
    k_base: int = Field(100, ge=1, le=1_000_000, description="finest grid: (hi - lo)/k_base")
    eta: float = Field(0.1, gt=0.0, le=10.0, description="step = (hi-lo)·max(1/K_base, score/η)")
    epoch_readings: int = Field(64, ge=1, description="the step is recomputed only every this many readings")


class DimensionConfig(_Model):
    """One coordinate of the device's record: numeric with bounds [lo, hi], or categorical with domain size k."""

    name: Ident
    kind: Literal["numeric", "categorical"]
    lo: float | None = None
    hi: float | None = None
    k: int | None = Field(None, ge=2, le=1 << 24)
    categories: list[str] | None = None
    source: str | None = Field(None, min_length=1, description="field of the source reading (default: name)")
    units: str | None = Field(None, min_length=1, max_length=32,
                              description="unit of measurement shown beside estimates (e.g. '°C', '%'); display only")
    rounding: RoundingConfig = RoundingConfig()

    @field_validator("lo", "hi")
    @classmethod
    def _finite_bounds(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name)

    @model_validator(mode="after")
    def _check_kind(self) -> "DimensionConfig":
        if self.kind == "numeric":
            if self.lo is None or self.hi is None:
                raise ValueError(f"numeric dimension {self.name!r} needs both lo and hi")
            if not self.lo < self.hi:
                raise ValueError(f"dimension {self.name!r}: lo must be < hi, got lo={self.lo}, hi={self.hi}")
            if self.k is not None or self.categories is not None:
                raise ValueError(f"numeric dimension {self.name!r} takes lo/hi, not k/categories")
        elif self.units is not None:
            raise ValueError(f"categorical dimension {self.name!r} has no units (name its categories instead)")
        else:
            if self.lo is not None or self.hi is not None:
                raise ValueError(f"categorical dimension {self.name!r} takes k or categories, not lo/hi")
            if self.categories is not None:
                if len(self.categories) < 2 or len(set(self.categories)) != len(self.categories):
                    raise ValueError(f"dimension {self.name!r}: categories must be >= 2 distinct labels")
                if self.k is not None and self.k != len(self.categories):
                    raise ValueError(
                        f"dimension {self.name!r}: k={self.k} but {len(self.categories)} categories are listed"
                    )
            elif self.k is None:
                raise ValueError(f"categorical dimension {self.name!r} needs k (domain size) or categories")
        return self

    @property
    def field(self) -> str:
        return self.source or self.name

    @property
    def domain_size(self) -> int:
        if self.kind != "categorical":
            raise ValueError(f"dimension {self.name!r} is numeric")
        return self.k if self.k is not None else len(self.categories or ())


class StreamConfig(_Model):
    """A privatized report: one dimension, or a group of numeric dimensions under one vector mechanism.

    ``mechanism`` is a catalogue name (``protocols.catalogue``) or ``"auto"`` (the lower-variance choice, see
    :func:`edge_agent.plans.choose_mechanism`); ``params`` are extra constructor arguments. ``epsilon`` is
    charged once per *new* memo entry (a memo hit costs 0); longitudinal mechanisms declare ``epsilon_1`` (one
    report) and ``epsilon_inf`` (the memoized part, which is what the ledger charges).
    """

    name: Ident
    dimensions: list[Ident] = Field(min_length=1)
    mechanism: str = AUTO
    params: dict[str, Any] = Field(default_factory=dict)
    epsilon: float | None = Field(None, gt=0)
    epsilon_1: float | None = Field(None, gt=0)
    epsilon_inf: float | None = Field(None, gt=0)
    cap: float | None = Field(None, gt=0, description="ledger cap for this stream (default: ledger.stream_cap)")
    unit: Literal["device", "value"] | None = Field(
        None, description="privacy unit of this stream's charges (default: privacy.unit); see the module docstring")
    memoize: bool | None = Field(
        None, description="memoize reports (value unit only; default: true under the value unit)")

    @field_validator("epsilon", "epsilon_1", "epsilon_inf", "cap")
    @classmethod
    def _finite_eps(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name)

    @model_validator(mode="after")
    def _check(self) -> "StreamConfig":
        if len(set(self.dimensions)) != len(self.dimensions):
            raise ValueError(f"stream {self.name!r} lists a dimension twice")
        if (self.epsilon_1 is None) != (self.epsilon_inf is None):
            raise ValueError(f"stream {self.name!r}: give both epsilon_1 and epsilon_inf (longitudinal) or neither")
        if self.epsilon_1 is not None and self.epsilon_inf is not None and not self.epsilon_1 < self.epsilon_inf:
            raise ValueError(f"stream {self.name!r}: epsilon_1 must be < epsilon_inf")
        if "epsilon" in self.params:
            raise ValueError(f"stream {self.name!r}: set epsilon on the stream, not in params")
        if self.memoize and self.unit == "device":
            raise ValueError(f"stream {self.name!r}: memoize = true needs unit = 'value' (a re-sent memoized report "
                             f"reveals when the value changes, which the device unit's ledger must bound)")
        return self

    @property
    def longitudinal(self) -> bool:
        return self.epsilon_inf is not None


class SourceConfig(_Model):
    """Where readings come from: ``system`` (/proc, /sys), ``replay`` (CSV/JSONL file) or ``plugin``."""

    kind: Literal["system", "replay", "plugin"]
    path: Path | None = None
    format: Literal["csv", "jsonl", "auto"] = "auto"
    time_column: str | None = None
    device_column: str | None = None
    realtime: bool = False
    loop: bool = False
    plugin: str | None = Field(None, description="entry point name in group haarvest.sources, or module:attr")
    options: dict[str, Any] = Field(default_factory=dict)
    thermal_zone: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "SourceConfig":
        if self.kind == "replay" and self.path is None:
            raise ValueError("a replay source needs path")
        if self.kind == "plugin" and not self.plugin:
            raise ValueError("a plugin source needs plugin = 'entry-point-name' or 'module:attr'")
        return self


PrivacyUnit = Literal["device", "value"]


class PrivacyConfig(_Model):
    epsilon: float = Field(1.0, gt=0, description="default ε per report for streams that do not set one")
    unit: PrivacyUnit = Field(
        "device", description="default privacy unit of every stream: device (user-level, the default) or value")
    max_round_epsilon: float = Field(4.0, gt=0, description="the most this device spends in one round")
    round_policy: Literal["clamp", "refuse"] = "clamp"
    log_invalid_values: bool = Field(
        False, description="show the offending value of an invalid reading in the agent's local log (off: it is "
                           "described by kind only — it may be a real reading, and logs can leave the device)")

    @field_validator("epsilon", "max_round_epsilon")
    @classmethod
    def _finite_eps(cls, v: float, info: Any) -> float:
        return _finite(v, info.field_name)  # type: ignore[return-value]


class LedgerConfig(_Model):
    total_cap: float = Field(gt=0, description="the most ε this device spends in all (per renewal window)")
    stream_cap: float | None = Field(None, gt=0, description="default per-stream cap")
    renewal_period_s: float | None = Field(None, gt=0, description="caps apply to any sliding window this long")
    delta_cap: float | None = Field(
        None, gt=0, lt=1,
        description="the most δ this device spends in all (per renewal window) on (ε, δ) mechanisms (Gaussian); "
                    "required by streams whose mechanism has δ > 0",
    )

    @model_validator(mode="after")
    def _check(self) -> "LedgerConfig":
        for name in ("total_cap", "stream_cap", "renewal_period_s", "delta_cap"):
            _finite(getattr(self, name), name)
        if self.stream_cap is not None and self.stream_cap > self.total_cap:
            raise ValueError(f"stream_cap ({self.stream_cap}) exceeds total_cap ({self.total_cap})")
        return self


class MqttConfig(_Model):
    host: str = "localhost"
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["5", "3.1.1", "auto"] = Field("auto", description="auto: MQTT 5, falling back to 3.1.1")
    keepalive: int = Field(30, ge=5, le=65535)
    session_expiry_s: int = Field(7 * 24 * 3600, ge=1, le=0xFFFFFFFE)
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    reconnect_min_s: int = Field(1, ge=1)
    reconnect_max_s: int = Field(60, ge=1)
    max_inflight: int = Field(20, ge=1, le=65535)
    client_id: str | None = None
    receipts: bool = Field(True, description="a report is delivered when the coordinator's receipt names it "
                           "(end to end); false: on a PUBACK with reason code 0 (broker delivery only)")
    receipt_timeout_s: float = Field(30.0, gt=0, description="re-send a report not receipted this long after its "
                                     "PUBACK (doubling per attempt, up to receipt_timeout_max_s)")
    receipt_timeout_max_s: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "MqttConfig":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("mqtt: give both cert_file and key_file (client certificate) or neither")
        if (self.cert_file or self.ca_file) and not self.tls:
            raise ValueError("mqtt: ca_file/cert_file are set but tls = false")
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("mqtt: reconnect_max_s must be >= reconnect_min_s")
        if self.receipt_timeout_max_s < self.receipt_timeout_s:
            raise ValueError("mqtt: receipt_timeout_max_s must be >= receipt_timeout_s")
        return self


class OutboxConfig(_Model):
    max_pending: int = Field(10_000, ge=1, description="pending (unacknowledged) reports; new ones refused beyond")
    keep_sent: int = Field(100_000, ge=0, description="sent rows kept before compaction folds them into totals")


class AgentConfig(_Model):
    """The whole agent configuration (validated; immutable)."""

    device_id: Ident
    state_dir: Path
    signing_key_file: Path | None = None
    hmac_secret_file: Path | None = None
    coordinator_public_key: str | None = None
    coordinator_public_key_file: Path | None = None
    schedule: Literal["rounds", "interval"] = Field(
        "rounds", description="rounds: answer signed round configs; interval: report every report_interval_s"
    )
    sample_interval_s: float = Field(10.0, gt=0, description="how often the source is read (volatility window)")
    report_interval_s: float = Field(60.0, gt=0, description="schedule = interval: how often to report")
    dimensions: list[DimensionConfig] = Field(min_length=1)
    streams: list[StreamConfig] = Field(default_factory=list)
    sources: list[SourceConfig] = Field(default_factory=list)
    privacy: PrivacyConfig = PrivacyConfig()
    ledger: LedgerConfig
    mqtt: MqttConfig | None = None
    outbox: OutboxConfig = OutboxConfig()

    @field_validator("sample_interval_s", "report_interval_s")
    @classmethod
    def _finite_interval(cls, v: float, info: Any) -> float:
        return _finite(v, info.field_name)  # type: ignore[return-value]

    @field_validator("coordinator_public_key")
    @classmethod
    def _check_pub(cls, v: str | None) -> str | None:
        if v is not None:
            wire.load_public_key(v)
        return v

    @model_validator(mode="after")
    def _check(self) -> "AgentConfig":
        names = [d.name for d in self.dimensions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate dimension names: {dupes}")
        by_name = {d.name: d for d in self.dimensions}
        snames = [s.name for s in self.streams]
        if len(set(snames)) != len(snames):
            raise ValueError("duplicate stream names")
        for s in self.streams:
            missing = [d for d in s.dimensions if d not in by_name]
            if missing:
                raise ValueError(f"stream {s.name!r} names unknown dimensions {missing}; known: {names}")
            kinds = {by_name[d].kind for d in s.dimensions}
            if "categorical" in kinds and len(s.dimensions) > 1:
                raise ValueError(f"stream {s.name!r}: a categorical dimension must be a stream of its own")
            if s.memoize and (s.unit or self.privacy.unit) == "device":
                raise ValueError(f"stream {s.name!r}: memoize = true needs unit = 'value' (privacy.unit is 'device')")
            eps = s.epsilon_inf if s.longitudinal else (s.epsilon or self.privacy.epsilon)
            cap = s.cap or self.ledger.stream_cap or self.ledger.total_cap
            if eps > cap:
                raise ValueError(f"stream {s.name!r}: ε per report {eps} exceeds its cap {cap}")
            if eps > self.privacy.max_round_epsilon:
                raise ValueError(
                    f"stream {s.name!r}: ε per report {eps} exceeds privacy.max_round_epsilon "
                    f"{self.privacy.max_round_epsilon}"
                )
        if self.coordinator_public_key and self.coordinator_public_key_file:
            raise ValueError("give coordinator_public_key or coordinator_public_key_file, not both")
        if self.schedule == "rounds" and self.mqtt is not None and not (
            self.coordinator_public_key or self.coordinator_public_key_file
        ):
            raise ValueError("schedule = 'rounds' needs the coordinator public key to verify round configs")
        return self

    # --- derived ------------------------------------------------------------------------------------------

    def effective_streams(self) -> list[StreamConfig]:
        """The configured streams, or one stream per dimension when none are configured."""
        if self.streams:
            return list(self.streams)
        return [StreamConfig(name=d.name, dimensions=[d.name]) for d in self.dimensions]

    def stream_epsilon(self, stream: StreamConfig) -> float:
        """ε charged for a new memo entry of ``stream`` (ε∞ for longitudinal streams)."""
        if stream.longitudinal:
            return float(stream.epsilon_inf)  # type: ignore[arg-type]
        return float(stream.epsilon if stream.epsilon is not None else self.privacy.epsilon)

    def stream_unit(self, stream: StreamConfig) -> str:
        """The privacy unit the ledger's charges for ``stream`` are true for: ``device`` or ``value``."""
        return stream.unit or self.privacy.unit

    def stream_memoizes(self, stream: StreamConfig) -> bool:
        """Whether ``stream`` re-sends memoized reports: only under the ``value`` unit (default on there)."""
        if self.stream_unit(stream) != "value":
            return False
        return True if stream.memoize is None else bool(stream.memoize)

    def stream_cap(self, stream: StreamConfig) -> float:
        return float(stream.cap or self.ledger.stream_cap or self.ledger.total_cap)

    def dimension(self, name: str) -> DimensionConfig:
        for d in self.dimensions:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key_file or self.state_dir / "device.key"

    @property
    def hmac_secret_path(self) -> Path:
        return self.hmac_secret_file or self.state_dir / "hmac.secret"

    @property
    def database_path(self) -> Path:
        return self.state_dir / "agent.sqlite3"

    def coordinator_key(self) -> Ed25519PublicKey | None:
        if self.coordinator_public_key:
            return wire.load_public_key(self.coordinator_public_key)
        if self.coordinator_public_key_file:
            try:
                text = self.coordinator_public_key_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"coordinator_public_key_file: cannot read: {exc}") from None
            try:
                return wire.load_public_key(text)
            except ValueError as exc:
                raise ConfigError(f"coordinator_public_key_file {self.coordinator_public_key_file}: {exc}") from None
        return None


# --- loading ------------------------------------------------------------------------------------------------


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Apply ``HAARVEST_AGENT__A__B=value`` overrides to the raw config mapping (a new dict is returned)."""
    import copy

    environ = os.environ if environ is None else environ
    out = copy.deepcopy(data)
    for key in sorted(environ):
        if not key.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in key[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            raise ConfigError(f"environment override {key}: empty path component")
        node: Any = out
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            value = _parse_env_value(environ[key]) if last else None
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"environment override {key}: no list item {part!r}")
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"environment override {key}: {'.'.join(parts[:i])} is not a table")
    return out


def format_validation_error(exc: ValidationError, origin: str = "config") -> str:
    lines = [f"{origin}: {exc.error_count()} problem(s)"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        msg = err.get("msg", "")
        if err.get("type") == "extra_forbidden":
            msg = "unknown key (typo?)"
        elif err.get("type") == "missing":
            msg = "required key is missing"
        lines.append(f"  - {where}: {msg}")
    return "\n".join(lines)


def parse_config(data: Mapping[str, Any], origin: str = "config", base_dir: Path | None = None) -> AgentConfig:
    """Validate a mapping into :class:`AgentConfig`; ConfigError with one line per problem.

    Relative paths are resolved against ``base_dir`` (the config file's directory) when given.
    """
    try:
        cfg = AgentConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin)) from None
    if base_dir is not None:
        cfg = _resolve_paths(cfg, base_dir)
    return cfg


def _resolve_paths(cfg: AgentConfig, base: Path) -> AgentConfig:
    def fix(p: Path | None) -> Path | None:
        return None if p is None or p.is_absolute() else base / p

    upd: dict[str, Any] = {}
    for name in ("state_dir", "signing_key_file", "hmac_secret_file", "coordinator_public_key_file"):
        new = fix(getattr(cfg, name))
        if new is not None:
            upd[name] = new
    if cfg.sources:
        upd["sources"] = [
            s.model_copy(update={"path": fix(s.path)}) if fix(s.path) is not None else s for s in cfg.sources
        ]
    if cfg.mqtt is not None:
        mupd = {n: fix(getattr(cfg.mqtt, n)) for n in ("ca_file", "cert_file", "key_file", "password_file")}
        upd["mqtt"] = cfg.mqtt.model_copy(update={k: v for k, v in mupd.items() if v is not None})
    return cfg.model_copy(update=upd)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Read the TOML file at ``path``, apply environment overrides, validate."""
    path = Path(path)
    data = apply_env_overrides(read_toml(path, ConfigError), environ)
    return parse_config(data, origin=str(path), base_dir=path.parent.resolve())


# --- secrets ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secrets:
    """The device identity: its report key (Ed25519 or HMAC-SHA256, :mod:`protocols.wire`) and the memo HMAC
    secret (keys the memoized randomness; it never leaves the device)."""

    signing_key: wire.DeviceKey
    hmac_secret: bytes

    @property
    def algorithm(self) -> str:
        return wire.key_algorithm(self.signing_key)

    @property
    def public_key_b64(self) -> str:
        """The coordinator's registry entry for this device (:func:`protocols.wire.registry_key`): the Ed25519
        public key, or — for ``hmac-sha256`` — the report key itself, which must reach the registry privately."""
        return wire.registry_key(self.signing_key)

    @property
    def key_id(self) -> str:
        """A public fingerprint of the report key (safe to publish, e.g. in the retained status message)."""
        return wire.registry_key_id(self.public_key_b64)


def _read_secret_file(path: Path, what: str) -> str:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} file {path} does not exist (create it with `haarvest agent enroll`)") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        import logging

        logging.getLogger("haarvest.agent").warning(
            "secret file is readable by group/others", extra={"path": str(path), "mode": oct(st.st_mode & 0o777)}
        )
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc}") from None


def load_secrets(cfg: AgentConfig) -> Secrets:
    """Read the device report key (base64 raw Ed25519, or ``hmac-sha256:<base64>``) and the memo HMAC secret
    (hex, ≥ 32 bytes)."""
    key_text = _read_secret_file(cfg.signing_key_path, "signing key")
    try:
        key = wire.load_device_key(key_text)
    except ValueError as exc:
        raise ConfigError(f"signing key file {cfg.signing_key_path}: {exc}") from None
    secret_text = _read_secret_file(cfg.hmac_secret_path, "HMAC secret")
    try:
        secret = bytes.fromhex(secret_text)
    except ValueError:
        raise ConfigError(f"HMAC secret file {cfg.hmac_secret_path}: not hex") from None
    if len(secret) < 32:
        raise ConfigError(f"HMAC secret file {cfg.hmac_secret_path}: must hold >= 32 bytes, got {len(secret)}")
    return Secrets(signing_key=key, hmac_secret=secret)


def write_private_file(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 (parent directories 0700 when created); refuses to overwrite."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def create_secrets(cfg: AgentConfig, overwrite: bool = False, signature: str = "ed25519") -> Secrets:
    """Create the report key (``signature``: ``ed25519`` or ``hmac-sha256``) and memo HMAC secret files
    (``enroll``). FileExistsError unless ``overwrite``."""
    import secrets as _secrets

    if signature not in wire.SIGNATURE_ALGORITHMS:
        raise ConfigError(f"unknown signature algorithm {signature!r}; choose one of "
                          f"{', '.join(wire.SIGNATURE_ALGORITHMS)}")

    for p in (cfg.signing_key_path, cfg.hmac_secret_path):
        if p.exists():
            if not overwrite:
                raise FileExistsError(f"{p} already exists (use --force to replace the device identity)")
            p.unlink()
    key = wire.generate_device_key(signature)
    secret = _secrets.token_bytes(32)
    write_private_file(cfg.signing_key_path, wire.device_key_text(key) + "\n")
    write_private_file(cfg.hmac_secret_path, secret.hex() + "\n")
    from .ledger_guard import mark_key, read_mark, start_mark

    if read_mark(cfg.state_dir) is None and not cfg.database_path.exists():
        start_mark(cfg.state_dir, mark_key(secret))  # a new ledger starts empty; from now on a missing one is refused
    return Secrets(signing_key=key, hmac_secret=secret)
