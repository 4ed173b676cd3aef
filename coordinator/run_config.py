"""Options of ``haarvest coordinator …`` from a TOML file (``--config FILE``) and the command line.

The keys of the file are the long options of ``haarvest coordinator run`` without the leading dashes, dashes or
underscores alike (``mqtt-port`` = ``mqtt_port``), all at the top level; every key is optional and an unknown key
is an error (a typo must not silently fall back to a default). Precedence: built-in default < file < an option given
on the command line. Relative paths in the file (``db``, ``key``, ``devices``, ``mqtt_ca``, ``mqtt_cert``,
``mqtt_key``) are relative to the file's directory; on the command line, to the working directory.

The other subcommands (``rounds …``, ``estimate``, ``export``, ``devices``, ``enroll-device``) take the same file
and use the keys they need (``db``, ``key`` and the ``mqtt_*`` connection keys), ignoring the rest — one file for
the service and the operator's commands::

    db = "/var/lib/haarvest-coordinator/coordinator.db"
    key = "/var/lib/haarvest-coordinator/coordinator.key"
    mqtt_host = "localhost"
    mqtt_port = 8883
    mqtt_ca = "/etc/haarvest/pki/ca.crt"
    mqtt_cert = "/etc/haarvest/coordinator/coordinator.crt"
    mqtt_key = "/etc/haarvest/coordinator/coordinator.key"
    http_port = 8080

TLS is used when ``mqtt_tls`` is true or a CA or client certificate is given (no ``mqtt_ca``: the system's CAs).
``mqtt_cert`` and ``mqtt_key`` (the PEM client certificate and its private key, e.g. from ``haarvest pki client
--id coordinator``) come together.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from coordinator import defaults
from protocols.errors import RunConfigError
from protocols.toml_file import read_toml

__all__ = ["RunOptions", "RunConfigError", "load_options", "read_config_file", "PATH_KEYS"]

DEFAULT_DB = defaults.DB
DEFAULT_KEY = defaults.KEY
#: keys holding file paths (resolved against the config file's directory)
PATH_KEYS = ("db", "key", "devices", "mqtt_ca", "mqtt_cert", "mqtt_key", "rounds_cert", "rounds_key", "api_tokens")
#: files that must exist when given (the round-signing ``key`` and a SQLite ``db`` are created if missing)
EXISTING_FILE_KEYS = ("devices", "mqtt_ca", "mqtt_cert", "mqtt_key", "rounds_cert", "rounds_key")


class RunOptions(BaseModel):
    """Every option of ``haarvest coordinator run`` (the long option name with underscores), validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    db: str = Field(DEFAULT_DB, min_length=1, description="SQLite path, sqlite:///path or postgresql:// URL")
    key: str = Field(DEFAULT_KEY, min_length=1, description="round-signing key file (created if missing)")
    mqtt_host: str = Field(defaults.MQTT_HOST, min_length=1, description="broker host (with TLS: a name in its certificate)")
    mqtt_port: int = Field(defaults.MQTT_PORT, ge=1, le=65535, description="broker port")
    client_id: str = Field(defaults.CLIENT_ID, min_length=1, max_length=65535,
                           description="MQTT client id of the ingest's persistent session (one per worker)")
    share_group: str | None = Field(None, min_length=1,
                                    description="shared-subscription group ($share: MQTT 5; mosquitto also for 3.1.1)")
    batch_size: int = Field(defaults.BATCH_SIZE, ge=1)
    batch_ms: float = Field(defaults.BATCH_MS, gt=0)
    replay_window: int | None = Field(None, ge=0, description="strict mode: reject a not yet stored seq this far "
                                      "below a device's high-water mark (default: none — devices re-send what "
                                      "was not receipted, late reports are normal)")
    http_host: str = Field(defaults.HTTP_HOST, min_length=1, description="address of the HTTP API and dashboard")
    http_port: int | None = Field(None, ge=0, le=65535, description="serve the API/dashboard (0: any free port)")
    api_tokens: str | None = Field(None, description="API bearer tokens, one per line (default: <db>.api-token "
                                   "beside a SQLite database, created with a random token); every route but "
                                   "/healthz needs one")
    flood_max_messages: int = Field(defaults.FLOOD_MAX_MESSAGES, ge=0, description="quarantine a device that sends more messages than this "
                                    "in one flood window (0: no limit)")
    flood_max_rejections: int = Field(defaults.FLOOD_MAX_REJECTIONS, ge=0, description="quarantine a device with more rejected messages than "
                                      "this in one flood window (duplicates and round_closed not counted; 0: no limit)")
    flood_window_s: float = Field(defaults.FLOOD_WINDOW_S, gt=0, description="the flood window, seconds")
    broker_quarantine: bool = Field(defaults.BROKER_QUARANTINE, description="cut quarantined devices off at the broker (mosquitto's "
                                    "dynamic-security plugin, deploy/mosquitto/haarvest.conf)")
    devices: str | None = Field(None, description="JSON file of devices to enroll at start")
    mqtt_username: str | None = Field(None, description="MQTT user name (not needed with a client certificate)")
    mqtt_password: str | None = Field(None, description="MQTT password (prefer the config file to the command line)")
    mqtt_tls: bool = False
    mqtt_ca: str | None = None
    mqtt_cert: str | None = None
    mqtt_key: str | None = None
    mqtt_protocol: Literal["5", "3.1.1", "auto"] = defaults.MQTT_PROTOCOL
    rounds_cert: str | None = Field(None, description="the round publisher's own client certificate (CN "
                                    "coordinator-rounds): `coordinator rounds` never connects with the ingest's")
    rounds_key: str | None = Field(None, description="the round publisher certificate's private key (PEM)")

    @field_validator("mqtt_protocol", mode="before")
    @classmethod
    def _protocol_number(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # mqtt_protocol = 5

    @field_validator("share_group")
    @classmethod
    def _share_group(cls, v: str | None) -> str | None:
        if v is not None and any(c in v for c in "/+#"):
            raise ValueError("must not contain '/', '+' or '#'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "RunOptions":
        if (self.mqtt_cert is None) != (self.mqtt_key is None):
            raise ValueError("mqtt_cert and mqtt_key (the client certificate and its private key) come together")
        if (self.rounds_cert is None) != (self.rounds_key is None):
            raise ValueError("rounds_cert and rounds_key (the round publisher's certificate and key) come together")
        if self.mqtt_password is not None and self.mqtt_username is None:
            raise ValueError("mqtt_password without mqtt_username")
        return self

    @property
    def tls(self) -> bool:
        """Connect with TLS: asked for, or a CA or client certificate given."""
        return self.mqtt_tls or self.mqtt_ca is not None or self.mqtt_cert is not None

    def check_files(self, names: tuple[str, ...] = EXISTING_FILE_KEYS) -> None:
        """RunConfigError unless every given option of ``names`` (by default the CA, client certificate and key,
        and devices file) names a readable file."""
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            path = Path(value)
            try:
                with path.open("rb"):
                    pass
            except OSError as exc:
                raise RunConfigError(f"{name} = {value!r}: cannot read it ({exc.strerror or exc})") from None
            if not path.is_file():
                raise RunConfigError(f"{name} = {value!r}: not a file")


def _format(exc: ValidationError, origin: str) -> str:
    lines = [f"{origin}: {exc.error_count()} problem(s)"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "(options)"
        msg = err.get("msg", "")
        if err.get("type") == "extra_forbidden":
            known = ", ".join(RunOptions.model_fields)
            msg = f"unknown key (typo?); the keys are: {known}"
        lines.append(f"  - {where}: {msg.removeprefix('Value error, ')}")
    return "\n".join(lines)


def _is_path(name: str, value: Any) -> bool:
    if name not in PATH_KEYS or not isinstance(value, str):
        return False
    return not (name == "db" and (value.startswith(("postgresql://", "postgres://")) or value == ":memory:"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The options in a TOML file: keys normalised to underscores, validated, relative paths resolved against the
    file's directory. Returns only the keys the file sets. RunConfigError (file and key named) otherwise."""
    path = Path(path)
    data = read_toml(path, RunConfigError)
    out: dict[str, Any] = {}
    for name, value in data.items():
        key = name.replace("-", "_")
        if key in out:
            raise RunConfigError(f"{path}: {name!r} is given twice (dashes and underscores are the same key)")
        out[key] = value
    try:
        RunOptions.model_validate(out)
    except ValidationError as exc:
        raise RunConfigError(_format(exc, str(path))) from None
    base = path.parent.resolve()
    for key, value in out.items():
        if _is_path(key, value):
            p = Path(value)
            if value.startswith("sqlite:///"):
                p = Path(value[len("sqlite:///"):])
            out[key] = str(p if p.is_absolute() else base / p)
    return out


def load_options(config: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> RunOptions:
    """Defaults, then the file ``config`` (if any), then ``overrides`` (the options given on the command line)."""
    data = read_config_file(config) if config is not None else {}
    given = dict(overrides or {})
    data.update(given)
    try:
        return RunOptions.model_validate(data)
    except ValidationError as exc:
        origin = f"{config} and the command line" if config is not None and given else str(config or "options")
        raise RunConfigError(_format(exc, origin)) from None
