"""The longitudinal protocol interface: a per-device client, a vectorised fleet simulator, a vectorised aggregator.

Two layers. :class:`LongitudinalProtocol` / :class:`LongitudinalClient` are what *every* protocol honours
(parameters, guarantees and transcript bounds, a device client with JSON state, fleet simulation, estimation);
:class:`MemoizedProtocol` / :class:`MemoizedClient` add memoization — memo slots, a permanent randomized response
(PRR) per slot and a fresh instantaneous one (IRR) per report — for L-GRR, L-OSUE/L-SUE, LOLOHA, RAPPOR, dBitFlipPM
and 1BitMean. DDRM's difference trees (:mod:`protocols.longitudinal.ddrm`) derive from the common layer only: they
have no memo slots, PRRs or IRRs, so they carry none of those methods.

Every protocol in :mod:`protocols.longitudinal` offers three views of the same randomizer:

* ``protocol.client(...)`` — the object a device runs: ``report(value) -> LongitudinalReport`` with the report
  *and* the privacy charge (memoized protocols: ε∞ for a new memo entry, 0 when memoized), state as plain JSON-able
  data (``to_state()`` / :func:`client_from_state`);
* ``protocol.new_fleet(n, rng)`` + ``protocol.privatize_round(values_t, fleet, rng)`` — n simulated devices at once
  (numpy over users; memoization through a keyed PRF, :mod:`protocols.longitudinal.prf`);
* ``protocol.estimate_round(reports)`` — the server's unbiased per-round estimate, vectorised.

Privacy of a whole transcript of a memoized protocol (what memoization does and does not protect). Let the memo
*slot* of a report be what the PRR is keyed on (the value; LOLOHA's hashed value; dBitFlipPM's sampled bucket; a
grid point). The PRR table T[s] is data-independent as a whole and report t is IRR(T[s_t]). Hence, for two value
sequences a, b of length τ with slot sequences s(a), s(b):

1. if s(a) and s(b) have the same *pattern* (the same positions share a slot), the transcript is a post-processing
   of the distinct slots' PRRs, so it is (ε∞·#{distinct slots j with s_j(a) ≠ s_j(b)})-indistinguishable — at most
   the total the ledger charged (ε∞ per new memo entry, 0 for memoized reports);
2. always, conditioning on T, the reports are independent IRRs: ε_IRR-input · #{t : s_t(a) ≠ s_t(b)}, where
   ε_IRR-input is the IRR's ε for an arbitrary change of its input (Σ over bits for bit vectors);
3. a single report is ε1-LDP.

When the patterns differ (e.g. "a, a" versus "a, b") bound 1 does not apply: memoization reveals *when* a value
changes, and only the fresh IRR protects that (bound 2; infinite for protocols without an IRR such as dBitFlipPM).
:meth:`MemoizedProtocol.transcript_epsilon_bound` returns the minimum of the valid bounds; the audit tests
check transcripts against it.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np

from protocols.accounting import memo_slots_bound
from protocols.base import check_int, os_rng
from protocols.longitudinal.memo import (
    MEMO_STYLES,
    LongitudinalReport,
    MemoStyle,
    MemoTable,
    encode_value,
    new_secret,
    prr_generator,
)
from protocols.memo_key import check_secret, slot_key
from protocols.longitudinal.prf import draw_keys

__all__ = [
    "FleetState",
    "SimulationResult",
    "LongitudinalProtocol",
    "LongitudinalClient",
    "MemoizedProtocol",
    "MemoizedClient",
    "client_from_state",
    "protocol_from_params",
    "slot_pattern",
    "grr_fresh",
]

@dataclass
class FleetState:
    """Persistent state of n simulated devices (what each device would keep on disk).

    ``keys`` are the devices' PRF keys (stand-in for their HMAC secrets), ``seen[i, s]`` records whether device
    i has already been charged for memo slot s, ``aux`` holds protocol-specific per-device arrays (hash seeds,
    cohorts, sampled buckets, rounding offsets, ...), ``spent`` the ε charged so far per device.
    """

    keys: np.ndarray
    seen: np.ndarray
    aux: dict[str, np.ndarray] = field(default_factory=dict)
    spent: np.ndarray | None = None
    rounds: int = 0

    @property
    def n(self) -> int:
        return int(self.keys.size)


@dataclass(frozen=True)
class SimulationResult:
    """Output of ``simulate_rounds``: per-round estimates (τ, k) and per-device, per-round charges (n, τ)."""

    estimates: np.ndarray
    charges: np.ndarray

    @property
    def spent(self) -> np.ndarray:
        """Total ε charged per device over the τ rounds."""
        return self.charges.sum(axis=1)


def slot_pattern(slots: Any) -> tuple[int, ...]:
    """Relabel a slot sequence by order of first appearance: (7, 7, 3, 7) -> (0, 0, 1, 0)."""
    first: dict[Any, int] = {}
    return tuple(first.setdefault(s, len(first)) for s in slots)


def grr_fresh(z: np.ndarray, k: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Vectorised GRR over [k]: keep z w.p. p, else a uniformly random *other* symbol (fresh randomness)."""
    z = np.asarray(z, dtype=np.int64)
    keep = rng.random(z.shape) < p
    other = (z + 1 + rng.integers(0, k - 1, size=z.shape)) % k
    return np.where(keep, z, other)


def protocol_from_params(name: str, params: dict[str, Any]) -> LongitudinalProtocol:
    """Rebuild a protocol from ``protocol.name`` and ``protocol.params()`` (what device state persists; the
    protocol is found in :mod:`protocols.catalogue` by its ``name``)."""
    from protocols.catalogue import protocol_entry

    return protocol_entry(name).cls(**params)


def client_from_state(state: dict[str, Any], rng: np.random.Generator | None = None) -> LongitudinalClient:
    """Restore a device client from ``client.to_state()`` (e.g. after a reboot)."""
    if not isinstance(state, dict) or "protocol" not in state or "params" not in state:
        raise ValueError("client state must be a dict with 'protocol' and 'params'")
    protocol = protocol_from_params(state["protocol"], state["params"])
    return protocol.client_class.from_state(protocol, state, rng)


class LongitudinalProtocol(ABC):
    """What every longitudinal LDP protocol honours (memoized or not); see the module docstring.

    Attributes:
        epsilon_inf: ε∞, the guarantee of the protocol's unit of budget (a memo entry; a DDRM tree node).
        epsilon_1: ε1, the guarantee of one report on its own (ε1 ≤ ε∞).
    """

    name: ClassVar[str]
    epsilon_inf: float
    epsilon_1: float
    delta: float = 0.0

    # --- description ---------------------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """The one-report guarantee ε1 (what an audit of a single report checks)."""
        return self.epsilon_1

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able): ``type(self)(**self.params())`` rebuilds the protocol."""

    @property
    @abstractmethod
    def irr_input_epsilon(self) -> float:
        """ε of one report's fresh randomization for an arbitrary change of its input (math.inf without one)."""

    @abstractmethod
    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """Worst-case total charge of one device over any number of reports (``n_distinct``, when known, caps the
        number of budget units used: distinct memo slots, non-zero tree nodes)."""

    def fingerprint(self) -> str:
        """Short digest of (name, params): memo keys are bound to it, so a parameter change never reuses a PRR."""
        blob = json.dumps({"name": self.name, "params": self.params()}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    # --- device --------------------------------------------------------------------------------------------
    #: The per-device client class (each protocol module sets it right after defining its client).
    client_class: ClassVar[type[LongitudinalClient]]
    #: The name of the protocol's own per-device parameter, if it has one (a keyword of :meth:`client`).
    device_parameter: ClassVar[str | None] = None

    def client(self, **options: Any) -> LongitudinalClient:
        """A per-device client: ``rng`` (default :func:`protocols.base.os_rng`), ``stream`` and the client class's
        own options (memoized protocols: ``secret``, ``memo_style`` and the device parameter)."""
        return self.client_class(self, **options)

    # --- transcript privacy --------------------------------------------------------------------------------
    @abstractmethod
    def charged_total(self, values: Any, **device: Any) -> float:
        """What the ledger is charged for reporting ``values`` in order."""

    @abstractmethod
    def transcript_epsilon_bound(self, values_a: Any, values_b: Any, **device: Any) -> float:
        """A rigorous bound on ln P[transcript | a] / P[transcript | b] for one device."""

    @abstractmethod
    def device_epsilon(self, reports: int) -> float:
        """A rigorous bound on the loss of ``reports`` reports of one device against *any* other value sequence (the
        ``device`` privacy unit)."""

    # --- fleet simulation ----------------------------------------------------------------------------------
    @abstractmethod
    def new_fleet(self, n: int, rng: np.random.Generator, **fixed: Any) -> FleetState:
        """State for n simulated devices; ``fixed`` pins device parameters (e.g. LOLOHA ``seeds``) for audits."""

    @abstractmethod
    def privatize_round(self, values: Any, fleet: FleetState, rng: np.random.Generator) -> tuple[Any, np.ndarray]:
        """One collection round for all devices: (reports, charges (n,))."""

    @abstractmethod
    def estimate_round(self, reports: Any) -> Any:
        """Unbiased estimate from one round of reports."""

    def _estimate_history(self, history: list[Any]) -> Any:
        """The estimate after the rounds of ``history`` (each round's reports): by default the last round alone."""
        return self.estimate_round(history[-1])

    #: Whether :meth:`_estimate_history` needs every earlier round (then :meth:`simulate_rounds` keeps them).
    _keeps_history: ClassVar[bool] = False

    def simulate_rounds(
        self, values: Any, rng: np.random.Generator, fleet: FleetState | None = None, *,
        estimate: Any = None, **fixed: Any
    ) -> SimulationResult:
        """Run τ rounds for n devices (values shape (n, τ)): per-round estimates and charges.

        ``estimate`` (round indices, default every round) limits decoding to the rounds wanted: every round is
        still privatized and charged (memo state evolves as in a deployment), the others' estimate rows are NaN."""
        values = np.asarray(values)
        if values.ndim != 2 or values.shape[0] == 0 or values.shape[1] == 0:
            raise ValueError(f"values must have shape (n, tau) with n, tau >= 1, got {values.shape}")
        tau = values.shape[1]
        wanted = set(range(tau)) if estimate is None else {int(t) for t in estimate}
        if not wanted <= set(range(tau)):
            raise ValueError(f"estimate names rounds outside [0, {tau}): {sorted(wanted - set(range(tau)))}")
        if fleet is None:
            fleet = self.new_fleet(values.shape[0], rng, **fixed)
        elif fleet.n != values.shape[0]:
            raise ValueError(f"fleet has {fleet.n} devices but values has {values.shape[0]} rows")
        estimates: list[np.ndarray | None] = []
        charges = []
        history: list[Any] = []
        for t in range(tau):
            reports, charge = self.privatize_round(values[:, t], fleet, rng)
            history = history + [reports] if self._keeps_history else [reports]
            estimates.append(np.asarray(self._estimate_history(history), dtype=float) if t in wanted else None)
            charges.append(charge)
        shape = next(e.shape for e in estimates if e is not None) if wanted else (0,)
        rows = [e if e is not None else np.full(shape, np.nan) for e in estimates]
        return SimulationResult(np.asarray(rows), np.stack(charges, axis=1))

    def _check_values(self, values: Any) -> np.ndarray:
        return np.asarray(values)

    def _check_fleet_values(self, values: Any, fleet: FleetState) -> np.ndarray:
        values = self._check_values(values)
        if values.shape != (fleet.n,):
            raise ValueError(f"expected one value per device, shape ({fleet.n},), got {values.shape}")
        return values


class MemoizedProtocol(LongitudinalProtocol):
    """A memoized longitudinal protocol: one PRR per memo slot, a fresh IRR per report (module docstring).

    ``epsilon_inf`` is the guarantee of one memo entry against any number of reports of the same slot.
    """

    @property
    @abstractmethod
    def n_slots(self) -> int:
        """Number of distinct memo slots a device can ever create (the longitudinal bound is ε∞ × this)."""

    @property
    @abstractmethod
    def irr_input_epsilon(self) -> float:
        """ε of one IRR for an arbitrary change of its input (math.inf without an IRR); see module docstring."""

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """Worst-case total charge: ε∞ · min(n_distinct, n_slots) (n_distinct = distinct slots reported;
        :func:`protocols.accounting.memo_slots_bound`, the one formula)."""
        return memo_slots_bound(self.epsilon_inf, self.n_slots, n_distinct)

    def client(
        self,
        *,
        secret: bytes | str | None = None,
        stream: str = "default",
        memo_style: MemoStyle = "stateless",
        rng: np.random.Generator | None = None,
        **device: Any,
    ) -> LongitudinalClient:
        """A per-device client (secret defaults to fresh OS randomness, rng to :func:`protocols.base.os_rng`);
        ``device`` holds the protocol's own per-device parameter when one is pinned (LOLOHA ``seed``, RAPPOR
        ``cohort``, 1BitMean ``u``, dBitFlipPM ``sampled``), drawn fresh otherwise."""
        return self.client_class(self, secret=secret, stream=stream, memo_style=memo_style, rng=rng, **device)

    # --- transcript privacy --------------------------------------------------------------------------------
    def memo_slots(self, values: Any, **device: Any) -> list[Any]:
        """The memo slot of each value in a device's sequence (protocols with device parameters override)."""
        return [int(v) for v in np.asarray(self._check_values(np.asarray(values))).ravel()]

    def charged_total(self, values: Any, **device: Any) -> float:
        """What the ledger is charged for reporting ``values`` in order: ε∞ per distinct memo slot."""
        return self.epsilon_inf * len(set(self.memo_slots(values, **device)))

    def transcript_epsilon_bound(self, values_a: Any, values_b: Any, **device: Any) -> float:
        """A rigorous bound on ln P[transcript | a] / P[transcript | b] for one device (module docstring)."""
        sa, sb = self.memo_slots(values_a, **device), self.memo_slots(values_b, **device)
        if len(sa) != len(sb) or not sa:
            raise ValueError("both value sequences must be non-empty and of equal length")
        differing = sum(x != y for x, y in zip(sa, sb))
        if differing == 0:
            return 0.0
        bounds = [self.irr_input_epsilon * differing]
        if slot_pattern(sa) == slot_pattern(sb):
            first_a = list(dict.fromkeys(sa))
            first_b = list(dict.fromkeys(sb))
            bounds.append(self.epsilon_inf * sum(x != y for x, y in zip(first_a, first_b)))
        if len(sa) == 1:
            bounds.append(self.epsilon_1)
        return float(min(bounds))

    def device_epsilon(self, reports: int) -> float:
        """A rigorous bound on ln P[transcript | a]/P[transcript | b] for ``reports`` reports of one device against
        *any* other value sequence b (the ``device`` privacy unit): ``reports · irr_input_epsilon``.

        Proof (bound 2 of the module docstring made uniform): the PRR table T is drawn independently of the data,
        so P[y | a] = E_T[Π_t IRR(y_t | T[s_t(a)])]; for every T each factor changes by at most
        e^{irr_input_epsilon} when its input changes, and at most ``reports`` inputs can change. Memoization buys
        nothing under this unit: the per-report charge is the IRR's ε for an arbitrary input change, never less
        than ε1. Checked against exact enumeration for every pair of sequences with τ ≤ 4 over small domains
        (tests/edge_agent/test_privacy_units.py).
        """
        return check_int(reports, "reports", 0) * self.irr_input_epsilon

    # --- fleet simulation ----------------------------------------------------------------------------------
    def new_fleet(self, n: int, rng: np.random.Generator, **fixed: Any) -> FleetState:
        """State for n simulated devices; ``fixed`` pins device parameters (e.g. LOLOHA ``seeds``) for audits."""
        n = check_int(n, "n", 1)
        fleet = FleetState(
            keys=draw_keys(n, rng), seen=np.zeros((n, self.n_slots), dtype=bool), spent=np.zeros(n)
        )
        self._init_fleet(fleet, rng, **fixed)
        return fleet

    def _init_fleet(self, fleet: FleetState, rng: np.random.Generator, **fixed: Any) -> None:
        if fixed:
            raise ValueError(f"{self.name} has no per-device parameters to fix, got {sorted(fixed)}")

    def _charge(self, fleet: FleetState, slots: np.ndarray) -> np.ndarray:
        """ε∞ for devices whose slot is new this round, 0 otherwise; marks the slots as charged."""
        rows = np.arange(fleet.n)
        new = ~fleet.seen[rows, slots]
        fleet.seen[rows, slots] = True
        charges = np.where(new, self.epsilon_inf, 0.0)
        if fleet.spent is not None:
            fleet.spent += charges
        return charges


class LongitudinalClient(ABC):
    """One device's side of any longitudinal protocol: ``report(value)``, ``spent``, JSON state.

    State: ``to_state()`` → ``{"protocol", "params", "stream", "device"}`` (plus the memo fields of
    :class:`MemoizedClient`); :func:`client_from_state` restores it through :meth:`from_state`.
    """

    def __init__(
        self, protocol: LongitudinalProtocol, *, stream: str = "default", rng: np.random.Generator | None = None
    ) -> None:
        if not isinstance(stream, str) or not stream or "\x00" in stream:
            raise ValueError("stream must be a non-empty str without NUL characters")
        self.protocol = protocol
        self.stream = stream
        self.rng = os_rng() if rng is None else rng

    @abstractmethod
    def report(self, value: Any) -> LongitudinalReport:
        """Privatize one value: the report and the ε the ledger must charge for it."""

    @property
    @abstractmethod
    def spent(self) -> float:
        """ε charged so far by this client."""

    def _device_state(self) -> dict[str, Any]:
        return {}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"unexpected device state for {self.protocol.name}: {sorted(state)}")

    def to_state(self) -> dict[str, Any]:
        """Plain JSON-able state."""
        return {
            "protocol": self.protocol.name,
            "params": self.protocol.params(),
            "stream": self.stream,
            "device": self._device_state(),
        }

    @classmethod
    def from_state(
        cls, protocol: LongitudinalProtocol, state: dict[str, Any], rng: np.random.Generator | None = None
    ) -> LongitudinalClient:
        """The client of ``protocol`` that ``state`` (from :meth:`to_state`) describes."""
        client = cls(protocol, stream=state.get("stream", "default"), rng=rng)
        client._load_device_state(state.get("device", {}))
        return client


class MemoizedClient(LongitudinalClient):
    """One device's side of a memoized protocol (see :mod:`protocols.longitudinal.memo` for the two styles)."""

    def __init__(
        self,
        protocol: MemoizedProtocol,
        *,
        secret: bytes | str | None = None,
        stream: str = "default",
        memo_style: MemoStyle = "stateless",
        rng: np.random.Generator | None = None,
    ) -> None:
        if memo_style not in MEMO_STYLES:
            raise ValueError(f"memo_style must be one of {MEMO_STYLES}, got {memo_style!r}")
        super().__init__(protocol, stream=stream, rng=rng)
        self.protocol: MemoizedProtocol = protocol
        self.secret = new_secret() if secret is None else check_secret(secret)
        self.memo_style: MemoStyle = memo_style
        self.memo = MemoTable()

    @property
    def _hmac_stream(self) -> str:
        return f"{self.stream}/{self.protocol.name}/{self.protocol.fingerprint()}"

    @property
    def spent(self) -> float:
        """ε charged so far: ε∞ per memo entry."""
        return self.protocol.epsilon_inf * len(self.memo)

    # protocol hooks ------------------------------------------------------------------------------------------
    @abstractmethod
    def _slot(self, value: Any) -> Any:
        """The memo slot of a (validated) value: hashable, encodable by :func:`encode_value`."""

    @abstractmethod
    def _draw_prr(self, slot: Any, gen: np.random.Generator) -> Any:
        """The permanent randomized response of a slot, as JSON-able data."""

    @abstractmethod
    def _irr(self, prr: Any) -> Any:
        """The fresh instantaneous randomized response of a memoized PRR (uses ``self.rng``)."""

    # public API ----------------------------------------------------------------------------------------------
    def report(self, value: Any) -> LongitudinalReport:
        """Privatize one value: PRR from the memo (charged ε∞ if new), then a fresh IRR."""
        slot = self._slot(value)
        slot_bytes = encode_value(slot)
        key = slot_key(self.secret, self._hmac_stream, slot_bytes)
        is_new = key not in self.memo
        if self.memo_style == "stateless":
            prr = self._draw_prr(slot, prr_generator(self.secret, self._hmac_stream, slot_bytes))
            if is_new:
                self.memo.put(key, None)
        elif is_new:
            prr = self._draw_prr(slot, self.rng)
            self.memo.put(key, prr)
        else:
            prr = self.memo.get(key)
        charge = self.protocol.epsilon_inf if is_new else 0.0
        return LongitudinalReport(self._irr(prr), charge, key, is_new)

    def to_state(self) -> dict[str, Any]:
        """Plain JSON-able state (secret as hex, memo table, device parameters)."""
        return {
            "protocol": self.protocol.name,
            "params": self.protocol.params(),
            "secret": self.secret.hex(),
            "stream": self.stream,
            "memo_style": self.memo_style,
            "memo": self.memo.to_state(),
            "device": self._device_state(),
        }

    @classmethod
    def from_state(
        cls, protocol: LongitudinalProtocol, state: dict[str, Any], rng: np.random.Generator | None = None
    ) -> LongitudinalClient:
        if "secret" not in state or "memo_style" not in state:
            raise ValueError("a memoized client's state must contain 'secret' and 'memo_style'")
        client = cast(MemoizedClient, protocol.client(
            secret=state["secret"], stream=state.get("stream", "default"), memo_style=state["memo_style"], rng=rng
        ))
        client.memo = MemoTable.from_state(state.get("memo", {}))
        client._load_device_state(state.get("device", {}))
        return client
