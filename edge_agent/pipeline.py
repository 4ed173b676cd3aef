"""The edge pipeline (SPEC §2): validate → clip → volatility → α-rounding → normalise → memo key → privatize.

For one reading (a mapping field → value) :meth:`Pipeline.observe` returns a :class:`Record`:

1. **Validate** and 2. **clip** (:mod:`edge_agent.readings`);
3. **volatility** and 4. **adaptive α-point rounding** (:mod:`edge_agent.rounding_state`);
5. **Normalise** to ``t = 2(x − lo)/(hi − lo) − 1 ∈ [−1, 1]``.

Clipping and normalisation are :meth:`protocols.contract.Bounds.clip` and :meth:`~protocols.contract.Bounds.normalise`
(the bounds checked once per pipeline), applied to a reading's numeric dimensions at once — the same functions
(:func:`protocols.contract.clip`, :func:`protocols.contract.normalise`) the fleet simulator applies to a whole fleet.

:meth:`Pipeline.prepare` then turns a record into one :class:`PreparedReport` per stream. A stream is one dimension
or a *group* of numeric dimensions privatized together by one vector mechanism (``ksampling``, ``duchi_md``, or
``haar`` — :class:`protocols.pipeline.HaarRecord`, the memoized pipeline's record mechanism). The memo key
(:func:`protocols.memo_key.record_key`) is ``HMAC-SHA256(hmac_secret, "haarvest-memo-v1\\n" ‖
canonical_json([stream, spec, canonical rounded values]))`` in hex, where ``spec`` is the
canonical JSON of the mechanism name and parameters (so changing ε or the mechanism starts a new memo) and a
rounded value's canonical form is its integer grid index and step. Only memo keys and noisy report bodies are
stored — never raw readings.

Streams are planned by :mod:`edge_agent.plans` (mechanism policy, charges) and a round's stream specs are followed
or refused by :mod:`edge_agent.round_contract`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols import catalogue
from protocols.base import os_rng
from protocols.contract import Bounds, StreamSpec, heavy_hitter_items, make_body
from protocols.errors import InvalidRecord, SpecMismatch
from protocols.memo_key import canonical_value, device_seed, record_key

from .config import AgentConfig, DimensionConfig
from .plans import StreamPlan, build_stream_plan
from .readings import Record, check_value
from .rounding_state import DimensionRounding
from .round_contract import RoundPlans, plan_for_spec, spec_text

__all__ = ["Pipeline", "PreparedReport"]


@dataclass(frozen=True)
class PreparedReport:
    """Everything the report transaction needs for one stream; ``make_body()`` privatizes (memo miss only)."""

    stream: str
    mechanism: str
    spec: str
    memo_key: str
    epsilon: float
    cap: float
    memoize: bool
    make_body: Callable[[], dict[str, Any]] = field(repr=False)
    refresh: bool = False
    delta: float = 0.0
    unit: str = "device"
    until: float | None = None  # the end of the time the charge covers (a DDRM tree's end); None: the report
    #: (key, state) to persist in the report's own transaction, and what to do once it committed (DDRM trees)
    state: tuple[str, dict[str, Any]] | None = None
    on_commit: Callable[[], None] | None = field(default=None, repr=False)




class Pipeline:
    """The device-side pipeline for one agent configuration (see the module docstring).

    ``rounding_state`` is what :meth:`rounding_state` returned before (persisted by the agent); ``None`` draws
    fresh α offsets. Not thread-safe.
    """

    def __init__(
        self,
        config: AgentConfig,
        hmac_secret: bytes,
        rounding_state: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if len(hmac_secret) < 32:
            raise ValueError("the HMAC secret must be at least 32 bytes")
        self.config = config
        self._secret = bytes(hmac_secret)
        self.dimensions = list(config.dimensions)
        self.streams: dict[str, StreamPlan] = {
            s.name: build_stream_plan(config, s) for s in config.effective_streams()
        }
        #: the device's noise source: ONE generator seeded from OS entropy when the pipeline is built (never a fixed
        #: seed), drawn from by every privatization and α-offset draw (seeding a generator from the OS costs far more
        #: than a draw, so it is not done per report)
        self.rng = os_rng()
        rounding_state = rounding_state or {}
        self._rounding: dict[str, DimensionRounding] = {
            d.name: DimensionRounding(d, rounding_state.get(d.name), self.rng)
            for d in self.dimensions
            if d.kind == "numeric" and d.rounding.enabled
        }
        self.clipped_total: dict[str, int] = {d.name: 0 for d in self.dimensions if d.kind == "numeric"}
        #: the numeric dimensions and their bounds, clipped and normalised together once per reading
        self._numeric = [d for d in self.dimensions if d.kind == "numeric"]
        #: checked bounds by dimension names (:meth:`_bounds_of`); the reading's numeric dimensions' once, here
        self._dim_bounds: dict[tuple[str, ...], Bounds] = {}
        self._bounds = self._bounds_of(tuple(self._numeric)) if self._numeric else None
        self._round_plans: dict[tuple[str, str], StreamPlan] = {}
        self._last_spec: dict[str, tuple[StreamSpec, StreamPlan]] = {}
        self._clients: dict[tuple[str, str], Any] = {}
        #: ddrm streams' trees ({"spec", "start", "client"}), persisted with the reports (rounding table, key
        #: "stream:<name>"): the client state holds the categories at level boundaries, which never leave the device
        self._trees: dict[str, dict[str, Any]] = {
            k.split(":", 1)[1]: dict(v) for k, v in (rounding_state or {}).items() if k.startswith("stream:")
        }

    # --- observe ------------------------------------------------------------------------------------------

    def validate(self, reading: Mapping[str, Any]) -> dict[str, float | int]:
        """Check every dimension of ``reading``; raw (unclipped) values, or :class:`InvalidRecord`."""
        if not isinstance(reading, Mapping):
            raise InvalidRecord("wrong_type", "(record)", f"a reading must be a mapping, got {type(reading).__name__}")
        out: dict[str, float | int] = {}
        for d in self.dimensions:
            if d.field not in reading or reading[d.field] is None:
                raise InvalidRecord("missing", d.name, f"field {d.field!r} not in reading")
            out[d.name] = check_value(d, reading[d.field])
        return out

    def observe(self, reading: Mapping[str, Any]) -> Record:
        """Validate, clip, update volatility windows, round and normalise one reading."""
        raw = self.validate(reading)
        values: dict[str, float | int] = {}
        normalised: dict[str, float] = {}
        canonical: dict[str, list[Any]] = {}
        exact: dict[str, float] = {}
        clipped: list[str] = []
        rounded: list[str] = []
        numeric = self._numeric
        bounds = self._bounds
        xs = bounds.clip_row([raw[d.name] for d in numeric]) if bounds is not None else []  # finite: validate
        for d, x in zip(numeric, xs):
            if x != raw[d.name]:
                clipped.append(d.name)
                self.clipped_total[d.name] += 1
            exact[d.name] = x
        for d in self.dimensions:
            if d.kind == "categorical":
                v = int(raw[d.name])
                values[d.name] = v
                canonical[d.name] = ["c", v]
                continue
            x = exact[d.name]
            rnd = self._rounding.get(d.name)
            if rnd is not None:
                x, canon, was_rounded = rnd.observe(x)
                if was_rounded:
                    rounded.append(d.name)
            else:
                canon = canonical_value(x)
            values[d.name] = x
            canonical[d.name] = canon
        # the clipped readings, α-rounded within their bounds: normalised without a second check and clip
        ts = bounds.scale_row([values[d.name] for d in numeric]) if bounds is not None else []
        for d, t in zip(numeric, ts):
            normalised[d.name] = t
        return Record(values, normalised, canonical, tuple(clipped), tuple(rounded), exact)

    # --- prepare ------------------------------------------------------------------------------------------

    def _view(self, plan: StreamPlan, record: Record) -> tuple[list[Any], list[float]]:
        """(canonical memo-key forms, normalised values) of the plan's dimensions — with the round's rounding
        steps when the plan has them (see :meth:`DimensionRounding.round_with`)."""
        canon = [record.canonical[d.name] for d in plan.dimensions]
        if plan.kind == "categorical":
            if plan.heavy_hitters is not None:
                canon = [["h", self._item(plan, record)]]
            return canon, []
        if plan.distribution:  # the memo key is what the mechanism sees: the bucket (Square Wave: the value)
            if plan.mechanism.bucketised:
                canon = [["b", int(plan.grid().bucket([record.values[plan.dimensions[0].name]])[0])]]
            return canon, []
        t = [record.normalised[d.name] for d in plan.dimensions]
        if plan.rounding is None:
            return canon, t
        redone: list[int] = []
        ys: list[float] = []
        for j, (d, step) in enumerate(zip(plan.dimensions, plan.rounding)):
            x = record.exact.get(d.name)
            if x is None:
                continue
            rnd = self._rounding.get(d.name)
            if step is None or rnd is None:  # the round asks for the exact value (or the dimension never rounds)
                y, canon[j] = x, canonical_value(x)
            else:
                y, canon[j] = rnd.round_with(x, step)
            redone.append(j)
            ys.append(y)
        if redone:
            ts = self._bounds_of(tuple(plan.dimensions[j] for j in redone)).normalise(ys).tolist()
            for j, tj in zip(redone, ts):
                t[j] = tj
        return canon, t

    def _bounds_of(self, dims: tuple[DimensionConfig, ...]) -> Bounds:
        """The checked bounds of these numeric dimensions (remembered: a round's rounded dimensions are renormalised
        with every reading)."""
        key = tuple(d.name for d in dims)
        bounds = self._dim_bounds.get(key)
        if bounds is None:
            bounds = self._dim_bounds[key] = Bounds([float(d.lo) for d in dims],  # type: ignore[arg-type]
                                                    [float(d.hi) for d in dims])  # type: ignore[arg-type]
        return bounds

    @staticmethod
    def _item(plan: StreamPlan, record: Record) -> int:
        """A heavy-hitter round's oracle item for the value (:func:`protocols.contract.heavy_hitter_items`)."""
        assert plan.heavy_hitters is not None
        return int(heavy_hitter_items(plan.heavy_hitters, [record.values[plan.dimensions[0].name]])[0])

    def _mechanism_input(self, plan: StreamPlan, record: Record, t: list[float]) -> np.ndarray:
        if plan.kind == "categorical":
            value = self._item(plan, record) if plan.heavy_hitters is not None \
                else record.values[plan.dimensions[0].name]
            return np.asarray([value], dtype=np.int64)
        if plan.distribution:  # the clipped (α-rounded) value on the unit scale of the public grid
            return plan.grid().unit([record.values[plan.dimensions[0].name]])
        # vector mechanisms (k-sampling, Duchi multi-dim, HaarRecord) take one row of d values
        vector = catalogue.entry(plan.mechanism_name).family in (catalogue.Family.VECTOR, catalogue.Family.HAAR)
        return np.asarray([t], dtype=float) if vector else np.asarray(t, dtype=float)

    def _body_maker(self, plan: StreamPlan, x: np.ndarray) -> Callable[[], dict[str, Any]]:
        codec, mech = catalogue.entry(plan.mechanism_name), plan.mechanism
        if plan.distribution:  # privatizes the value on the unit scale of its grid (``_mechanism_input``)
            def row() -> Any:
                return np.asarray(mech.privatize_unit(x, self.rng))[0]
        else:  # the one user's row (``privatize_one``: the batch's draws without its per-call cost)
            def row() -> Any:
                return mech.privatize_one(x[0], self.rng)

        def new_body() -> dict[str, Any]:
            return make_body(codec.encode_row(mech, row()))

        return new_body

    def _client(self, plan: StreamPlan) -> Any:
        """The :mod:`protocols.longitudinal` client of a longitudinal plan (cached; stateless PRR keyed by the
        device secret, fresh IRR randomness from the OS; LOLOHA's hash seed derived from the secret)."""
        key = (plan.name, plan.spec)
        client = self._clients.get(key)
        if client is None:
            kwargs: dict[str, Any] = {"secret": self._secret, "stream": plan.name, "memo_style": "stateless",
                                      "rng": os_rng()}
            if plan.mechanism.device_parameter == "seed":  # a longitudinal protocol's ClassVar
                kwargs["seed"] = device_seed(self._secret, plan.name)
            client = plan.mechanism.client(**kwargs)
            self._clients[key] = client
        return client

    def _longitudinal_report(self, plan: StreamPlan, record: Record) -> tuple[str, Callable[[], dict[str, Any]]]:
        """(protocol memo key, body maker): each call of the maker is a fresh IRR of the slot's memoized PRR."""
        client = self._client(plan)
        value = int(record.values[plan.dimensions[0].name])
        first = client.report(value)
        pending = [first]

        def new_body() -> dict[str, Any]:
            rep = pending.pop() if pending else client.report(value)
            return make_body(catalogue.entry(plan.mechanism_name).encode_row(plan.mechanism, rep.report))

        return str(first.memo_key), new_body

    def plan_for(self, name: str, spec: StreamSpec | Mapping[str, Any]) -> StreamPlan:
        """The plan for stream ``name`` following a round's StreamSpec (:func:`plan_for_spec`; cached)."""
        if not isinstance(spec, StreamSpec):
            try:
                spec = StreamSpec.model_validate(dict(spec))
            except (ValueError, TypeError) as exc:
                raise SpecMismatch("malformed", str(exc).splitlines()[0]) from None
        else:
            last = self._last_spec.get(name)
            if last is not None and last[0] is spec:  # the same validated spec object as last time: same plan
                return last[1]
        cache_key = (name, spec_text(spec))
        plan = self._round_plans.get(cache_key)
        if plan is None:
            plan = plan_for_spec(self.streams[name], spec)
            if len(self._round_plans) > 256:
                self._round_plans.clear()
            self._round_plans[cache_key] = plan
        self._last_spec[name] = (spec, plan)
        return plan

    def round_plans(self, params: Mapping[str, Any]) -> RoundPlans:
        """How to answer a round with ``RoundConfig.params``: ``streams`` absent (every stream, as configured), a
        list of stream names, or the coordinator's ``{stream: StreamSpec}`` mapping (each spec checked by
        :meth:`plan_for`; a refused stream is skipped with its reason). ValueError if ``streams`` is malformed."""
        streams = params.get("streams") if isinstance(params, Mapping) else None
        if streams is None:
            return RoundPlans(None)
        if isinstance(streams, list):
            if not all(isinstance(s, str) for s in streams):
                raise ValueError("params.streams must be a list of names or a mapping of stream specs")
            return RoundPlans([s for s in streams if s in self.streams], unknown=[s for s in streams
                                                                                  if s not in self.streams])
        if not isinstance(streams, Mapping):
            raise ValueError("params.streams must be a list of names or a mapping of stream specs")
        out = RoundPlans([])
        for name, spec in streams.items():
            if name not in self.streams:
                out.unknown.append(str(name))
                continue
            try:
                out.plans[name] = self.plan_for(name, spec)
            except SpecMismatch as exc:
                out.refused.append((name, exc.reason))
                continue
            out.streams.append(name)  # type: ignore[union-attr]
        return out

    def stream_specs(self) -> dict[str, dict[str, Any]]:
        """``{stream: StreamSpec}`` (JSON-ready) a round must send to get this device's configured reports."""
        return {name: plan.stream_spec() for name, plan in self.streams.items()}

    def prepare(
        self, record: Record, streams: list[str] | None = None, plans: Mapping[str, StreamPlan] | None = None,
        now: float = 0.0,
    ) -> list[PreparedReport]:
        """One :class:`PreparedReport` per stream (all streams, or the named ones in configuration order);
        ``plans`` replaces the configured plan of some streams for this round (see :meth:`round_plans`)."""
        names = list(self.streams) if streams is None else [s for s in self.streams if s in set(streams)]
        out = []
        for name in names:
            plan = (plans or {}).get(name) or self.streams[name]
            if plan.change_bounded:
                out.append(self._tree_report(plan, record, now))
                continue
            if plan.longitudinal:
                key, body_maker = self._longitudinal_report(plan, record)
                refresh = True
            else:
                canon, t = self._view(plan, record)
                key = record_key(self._secret, name, plan.spec, canon)
                body_maker = self._body_maker(plan, self._mechanism_input(plan, record, t))
                refresh = False
            out.append(
                PreparedReport(
                    stream=name,
                    mechanism=plan.mechanism_name,
                    spec=plan.spec,
                    memo_key=key,
                    epsilon=plan.charge,
                    cap=plan.cap,
                    memoize=plan.memoize,
                    make_body=body_maker,
                    refresh=refresh,
                    delta=plan.delta,
                    unit=plan.unit,
                )
            )
        return out

    def _tree_report(self, plan: StreamPlan, record: Record, now: float) -> PreparedReport:
        """A ``ddrm`` stream's report: the next step of its tree (a new tree when the last one is complete or older
        than the renewal period). The step's charge (``step_charge``, data-independent) covers the releases up to
        the tree's end (``until`` = tree start + renewal period), so any sliding budget window that sees part of a
        tree counts every charge of it up to then; the new tree state commits with the report or not at all."""
        from protocols.longitudinal.base import client_from_state

        mech = plan.mechanism
        period = self.config.ledger.renewal_period_s
        key = f"stream:{plan.name}"
        saved = self._trees.get(plan.name)
        fresh = (saved is None or saved["spec"] != plan.spec or saved["client"]["device"]["t"] >= mech.horizon
                 or (period is not None and now >= saved["start"] + period))
        if fresh:
            client = mech.client(secret=self._secret, stream=plan.name, rng=self.rng)
            start = now
        else:
            client = client_from_state(saved["client"], rng=self.rng)  # type: ignore[index]
            start = saved["start"]  # type: ignore[index]
        rep = client.report(int(record.values[plan.dimensions[0].name]))
        state = {"spec": plan.spec, "start": start, "client": client.to_state()}
        body = make_body(catalogue.entry(plan.mechanism_name).encode_row(plan.mechanism, rep.report))

        def committed() -> None:
            self._trees[plan.name] = state

        return PreparedReport(
            stream=plan.name, mechanism=plan.mechanism_name, spec=plan.spec, memo_key=f"tree:{start!r}",
            epsilon=float(rep.charge), cap=plan.cap, memoize=False, make_body=lambda: body, delta=0.0,
            unit=plan.unit, until=None if period is None else start + period, state=(key, state),
            on_commit=committed)

    # --- persistence --------------------------------------------------------------------------------------

    @property
    def rounding_dirty(self) -> bool:
        return any(r.dirty for r in self._rounding.values())

    def rounding_saved(self) -> None:
        """The state last returned by ``rounding_state(clear_dirty=False)`` is durable: clear the dirty flags."""
        for r in self._rounding.values():
            r.dirty = False

    def rounding_state(self, clear_dirty: bool = True) -> dict[str, dict[str, Any]]:
        """Per-dimension α offsets, current epoch plan and reading index (no raw values) for the state DB."""
        states = {name: r.to_state() for name, r in self._rounding.items()}
        if clear_dirty:
            for r in self._rounding.values():
                r.dirty = False
        return states

    def volatility_scores(self) -> dict[str, float]:
        return {name: float(r.detector.scores[0]) for name, r in self._rounding.items()}
