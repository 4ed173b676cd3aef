"""haarvest's public error surface: every exception the packages raise on purpose, under one base, with the
reason codes as enums.

One module, like the Azure IoT device SDK's ``exceptions.py``: ``except HaarvestError`` catches anything haarvest
raises by design (a bug still surfaces as a plain Python exception). Each class also derives from the built-in
it has always been (``ValueError`` for bad input, ``RuntimeError`` for an environment that cannot serve), so
``except ValueError`` keeps working. Classes with a ``reason`` carry a short code; the codes a class can carry are
the members of its enum (a :class:`~enum.StrEnum`: a member *is* its string, so counters and logs read the same).
It lives in :mod:`protocols` — the package the device, the coordinator and the simulations all import — so the
device never imports the coordinator to name an error.

* :class:`WireError` (protocols.wire, coordinator.validate): a message that is malformed, unsigned, wrongly signed
  or otherwise unacceptable (:class:`RejectReason`);
* :class:`BudgetExceededError` (protocols.accounting): a charge would pass a cap; nothing recorded
  (:class:`CapReason`);
* :class:`Refused` (edge_agent.state, edge_agent.agent): a report the device will not send (:class:`RefusalReason`);
* :class:`SpecMismatch` (edge_agent.round_contract): a round's stream spec the device will not follow
  (:class:`SpecMismatchReason`);
* :class:`InvalidRecord` (edge_agent.readings): a reading that cannot be reported (:class:`InvalidReason`);
* :class:`ConfigError` (edge_agent.config, edge_agent.plans): an agent configuration that cannot be used;
* :class:`SourceError` (edge_agent.sources): a data source that cannot be built or read;
* :class:`LedgerIntegrityError` (edge_agent.ledger_guard): a missing, older, foreign or damaged ledger;
* :class:`RunConfigError` (coordinator.run_config): a coordinator configuration that cannot be used;
* :class:`PublishError` (coordinator.cli): round configurations could not be published;
* :class:`DatasetError` (simulations.datasets): a data file missing or not matching its domain;
* :class:`BrokerUnavailable` (simulations.broker): neither mosquitto nor amqtt can be started;
* :class:`MissingPostgres` (simulations.postgres): the PostgreSQL server binaries (or a ``postgres`` user) are missing.
"""

from __future__ import annotations

import math
import numbers
from enum import StrEnum
from typing import Any

__all__ = [
    "OffGridError",
    "HaarvestError",
    "RejectReason",
    "CapReason",
    "RefusalReason",
    "SpecMismatchReason",
    "InvalidReason",
    "WireError",
    "BudgetExceededError",
    "Refused",
    "SpecMismatch",
    "InvalidRecord",
    "ConfigError",
    "SourceError",
    "LedgerIntegrityError",
    "RunConfigError",
    "PublishError",
    "DatasetError",
    "BrokerUnavailable",
    "MissingPostgres",
]


class HaarvestError(Exception):
    """Base of every exception haarvest raises on purpose."""


# --- reason codes --------------------------------------------------------------------------------------------


class RejectReason(StrEnum):
    """Why the coordinator rejected a message (``WireError.reason``; counted per reason and per device)."""

    TOO_LARGE = "too_large"
    MALFORMED = "malformed"
    SCHEMA = "schema"
    WRONG_TOPIC = "wrong_topic"
    DEVICE_MISMATCH = "device_mismatch"
    UNKNOWN_DEVICE = "unknown_device"
    REVOKED_DEVICE = "revoked_device"
    QUARANTINED = "quarantined"
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_ROUND = "unknown_round"
    ROUND_CLOSED = "round_closed"
    OFF_CONTRACT = "off_contract"
    WRONG_STREAM = "wrong_stream"
    WRONG_MECHANISM = "wrong_mechanism"
    BAD_BODY = "bad_body"
    OFF_GRID = "off_grid"  # numbers where the stream's mechanism releases grid indices (SPEC §3.0)
    SEQ_REGRESSION = "seq_regression"
    ALREADY_REPORTED = "already_reported"
    DUPLICATE = "duplicate"
    INTERNAL_ERROR = "internal_error"


class CapReason(StrEnum):
    """Which cap a charge would pass (``BudgetExceededError.reason``)."""

    STREAM_CAP = "stream_cap"
    TOTAL_CAP = "total_cap"
    ROUND_BUDGET = "round_budget"
    DELTA_CAP = "delta_cap"


# CapReason's members (same names and codes), then the two refusals that are not caps.
RefusalReason = StrEnum("RefusalReason", [*((m.name, m.value) for m in CapReason),
                                          ("OUTBOX_FULL", "outbox_full"), ("TOO_LARGE", "too_large")],
                        module=__name__, qualname="RefusalReason")
RefusalReason.__doc__ = ("Why the device refused to send a report (``Refused.reason``): a cap (:class:`CapReason`'s "
                         "codes), a full outbox or a payload above the wire limit.")


class SpecMismatchReason(StrEnum):
    """Why a device will not follow a round's stream spec (``SpecMismatch.reason``; docs/agent.md has the table).
    ``unknown`` is a stream the device does not have (never raised, reported by the round path)."""

    MALFORMED = "malformed"
    UNIT = "unit"
    KIND = "kind"
    DIMS = "dims"
    BOUNDS = "bounds"
    EPSILON = "epsilon"
    DELTA = "delta"
    SHAPE = "shape"
    MECHANISM = "mechanism"
    ROUNDING = "rounding"
    LABELS = "labels"
    UNKNOWN = "unknown"


class InvalidReason(StrEnum):
    """Why a reading cannot be reported (``InvalidRecord.reason``)."""

    MISSING = "missing"
    WRONG_TYPE = "wrong_type"
    NOT_FINITE = "not_finite"
    OUT_OF_DOMAIN = "out_of_domain"


def _reason(enum: type[StrEnum], reason: str) -> StrEnum:
    """``reason`` as a member of ``enum``; ValueError naming the known codes otherwise (a bug in the raiser)."""
    try:
        return enum(reason)
    except ValueError:
        raise ValueError(f"unknown {enum.__name__} {reason!r}; known: {', '.join(m.value for m in enum)}") from None


# --- errors with a reason ------------------------------------------------------------------------------------


class WireError(HaarvestError, ValueError):
    """A message that is malformed, unsigned, wrongly signed or otherwise unacceptable (:class:`RejectReason`)."""

    def __init__(self, reason: str, detail: str = "", device_id: str | None = None, seq: int | None = None) -> None:
        self.reason = _reason(RejectReason, reason)
        super().__init__(f"{self.reason}: {detail}" if detail else str(self.reason))
        #: the (authenticated) device a rejection is charged to, where one is known (per-device counters)
        self.device_id = device_id
        #: the report's seq when its signature verified: the device is told (receipt) not to re-send it
        self.seq = seq


class OffGridError(HaarvestError, ValueError):
    """A released value that is not an index of the mechanism's public grid (SPEC §3.0): an integer outside it, or a
    real number — the raw-double release of an older device, refused rather than decoded."""


class BudgetExceededError(HaarvestError, ValueError):
    """A charge would push a stream (or the total, a round, δ) past its cap; nothing was recorded
    (:class:`CapReason`)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = _reason(CapReason, reason)
        super().__init__(f"{self.reason}: {detail}" if detail else str(self.reason))
        self.detail = detail


class Refused(HaarvestError):
    """A report the device will not send (:class:`RefusalReason`); nothing was charged or sent."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = _reason(RefusalReason, reason)
        super().__init__(f"{self.reason}: {detail}" if detail else str(self.reason))
        self.detail = detail


class SpecMismatch(HaarvestError, ValueError):
    """A round's stream spec this device will not follow (:class:`SpecMismatchReason`)."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = _reason(SpecMismatchReason, reason)
        super().__init__(f"{self.reason}: {detail}")


class InvalidRecord(HaarvestError, ValueError):
    """A reading that cannot be reported (:class:`InvalidReason`).

    The message names the dimension and the reason only, never a value. ``value`` holds the offending value: the
    agent's log describes it by kind (:meth:`described_value`: "text of 16 characters", "a non-finite number",
    "an integer outside [0, 3)") beside the source line, so the operator can find it in the source; the value
    itself appears only with ``privacy.log_invalid_values = true`` (:meth:`shown_value`) — it may be a real
    reading, and a log can leave the device. Valid readings never reach a log."""

    def __init__(self, reason: str, dimension: str, detail: str = "", value: Any = None, domain: str = "") -> None:
        self.reason = _reason(InvalidReason, reason)
        super().__init__(f"dimension {dimension!r}: {self.reason}" + (f" ({detail})" if detail else ""))
        self.dimension = dimension
        self.value = value
        self.domain = domain

    def described_value(self) -> str:
        """The offending value's kind, without its content."""
        v = self.value
        if v is None:
            return "nothing"
        if isinstance(v, bool):
            return "a boolean"
        if isinstance(v, str):
            return f"text of {len(v)} characters"
        if isinstance(v, numbers.Real):
            x = float(v)
            if not math.isfinite(x):
                return "a non-finite number"
            if self.reason == InvalidReason.OUT_OF_DOMAIN:
                return f"an integer outside {self.domain}" if self.domain else "a number outside the domain"
            return "a number with a fractional part" if x != int(x) else "a number"
        return f"a {type(v).__name__}"

    def shown_value(self) -> str:
        """The offending value itself (repr, at most 40 characters): only with ``privacy.log_invalid_values``."""
        text = repr(self.value)
        return text if len(text) <= 40 else text[:37] + "..."


# --- errors of configuration and environment -----------------------------------------------------------------


class ConfigError(HaarvestError, ValueError):
    """An agent configuration that cannot be used; the message says which key and why."""


class SourceError(HaarvestError, RuntimeError):
    """A source that cannot be built or read (missing file, bad plugin, unreadable /proc)."""


class LedgerIntegrityError(HaarvestError, RuntimeError):
    """The ledger is missing, older than the device's mark, another ledger, or inconsistent: the agent refuses to
    start (the message is one line and says how to reset on purpose)."""


class RunConfigError(HaarvestError, ValueError):
    """A coordinator configuration file or option that cannot be used; the message names the file and key."""


class PublishError(HaarvestError, RuntimeError):
    """Round configurations could not be published (no connection, or the broker refused them)."""


class DatasetError(HaarvestError, ValueError):
    """A data file is missing or does not match its declared domain."""


class BrokerUnavailable(HaarvestError, RuntimeError):
    """Neither mosquitto nor amqtt can be started here."""


class MissingPostgres(HaarvestError, RuntimeError):
    """The PostgreSQL server binaries (or, as root, a ``postgres`` user to run them) are not available."""
