"""Where readings come from.

A *source* is any object with ``read() -> Mapping[str, Any] | None`` (one reading: field name → value; ``None``
when it has nothing more, e.g. a replay file at its end) and optionally ``close()``. Dimensions name the field they
take (``DimensionConfig.source``, default the dimension name); readings of several sources are merged.

* :class:`SystemMetrics` — Linux metrics read directly from /proc and /sys (no psutil): ``cpu_percent`` (since the
  previous read), ``load1/5/15``, ``mem_percent`` (1 - MemAvailable/MemTotal), ``temp_c`` (max over
  /sys/class/thermal/thermal_zone*/temp, absent when there is no thermal zone), ``net_rx_bytes``/``net_tx_bytes``
  (all interfaces but lo) and ``net_rx_rate``/``net_tx_rate`` (bytes/s since the previous read), ``uptime_s``.
* :class:`ReplaySource` — rows of a CSV or JSONL file in order, optionally filtered by a device column and paced by
  a time column (``realtime``).
* :class:`IterableSource` / :class:`CallableSource` — programmatic sources for embedding and tests.
* plugins — ``plugin = "name"`` loads entry point ``name`` of group ``haarvest.sources``; ``plugin = "pkg.mod:attr"``
  imports it directly. The object found is called with ``**options`` and must return a source.
"""

from __future__ import annotations

import csv
import importlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from protocols.errors import SourceError

__all__ = [
    "Source",
    "SourceError",
    "SystemMetrics",
    "ReplaySource",
    "IterableSource",
    "CallableSource",
    "MergedSource",
    "source_position",
    "load_plugin",
    "build_source",
    "build_sources",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "haarvest.sources"
Reading = Mapping[str, Any]


@runtime_checkable
class Source(Protocol):
    def read(self) -> Reading | None: ...


# --- system metrics -----------------------------------------------------------------------------------------


class SystemMetrics:
    """Linux system metrics from /proc and /sys. ``root`` lets tests point at a fake tree."""

    def __init__(self, root: str | Path = "/", thermal_zone: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.thermal_zone = thermal_zone
        self._clock = clock
        self._prev_cpu: tuple[int, int] | None = None
        self._prev_net: tuple[float, int, int] | None = None
        self._prev_cpu = self._cpu_times()  # so the first read has a baseline

    def _p(self, rel: str) -> Path:
        return self.root / rel

    def _cpu_times(self) -> tuple[int, int] | None:
        try:
            with open(self._p("proc/stat")) as fh:
                first = fh.readline().split()
        except OSError:
            return None
        if not first or first[0] != "cpu":
            return None
        vals = [int(v) for v in first[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
        # guest/guest_nice are already included in user/nice
        total = sum(vals[:8])
        return total, idle

    def cpu_percent(self) -> float | None:
        cur = self._cpu_times()
        prev, self._prev_cpu = self._prev_cpu, cur
        if cur is None or prev is None:
            return None
        dt, di = cur[0] - prev[0], cur[1] - prev[1]
        if dt <= 0:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (1.0 - di / dt)))

    def loadavg(self) -> dict[str, float]:
        try:
            parts = self._p("proc/loadavg").read_text().split()
            return {"load1": float(parts[0]), "load5": float(parts[1]), "load15": float(parts[2])}
        except (OSError, IndexError, ValueError):
            return {}

    def memory(self) -> dict[str, float]:
        info: dict[str, int] = {}
        try:
            for line in self._p("proc/meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                fields = rest.split()
                if fields:
                    info[key] = int(fields[0])
        except (OSError, ValueError):
            return {}
        total = info.get("MemTotal")
        avail = info.get("MemAvailable", info.get("MemFree"))
        if not total or avail is None:
            return {}
        return {"mem_percent": 100.0 * (1.0 - avail / total), "mem_total_kb": float(total)}

    def temperature(self) -> float | None:
        base = self._p("sys/class/thermal")
        zones = [base / self.thermal_zone] if self.thermal_zone else sorted(base.glob("thermal_zone*"))
        temps = []
        for z in zones:
            try:
                temps.append(int((z / "temp").read_text().strip()) / 1000.0)
            except (OSError, ValueError):
                continue
        return max(temps) if temps else None

    def network(self) -> dict[str, float]:
        rx = tx = 0
        try:
            lines = self._p("proc/net/dev").read_text().splitlines()[2:]
        except OSError:
            return {}
        for line in lines:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            fields = rest.split()
            if len(fields) >= 9:
                rx += int(fields[0])
                tx += int(fields[8])
        now = self._clock()
        out: dict[str, float] = {"net_rx_bytes": float(rx), "net_tx_bytes": float(tx)}
        if self._prev_net is not None:
            dt = now - self._prev_net[0]
            if dt > 0:
                out["net_rx_rate"] = max(0.0, (rx - self._prev_net[1]) / dt)
                out["net_tx_rate"] = max(0.0, (tx - self._prev_net[2]) / dt)
        self._prev_net = (now, rx, tx)
        return out

    def uptime(self) -> float | None:
        try:
            return float(self._p("proc/uptime").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        cpu = self.cpu_percent()
        if cpu is not None:
            out["cpu_percent"] = cpu
        out.update(self.loadavg())
        out.update(self.memory())
        temp = self.temperature()
        if temp is not None:
            out["temp_c"] = temp
        out.update(self.network())
        up = self.uptime()
        if up is not None:
            out["uptime_s"] = up
        return out


# --- replay -------------------------------------------------------------------------------------------------


def _coerce(value: Any) -> Any:
    """CSV cells are strings: numbers become int/float, empty cells None, the rest stays text."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class ReplaySource:
    """Replays a CSV (header row) or JSONL file row by row.

    ``time_column`` holds each row's timestamp (seconds); with ``realtime=True`` ``read()`` sleeps so rows are
    returned at their recorded pace. ``device_column``/``device`` keep only one device's rows of a fleet file.
    ``loop=True`` starts over at the end; otherwise ``read()`` returns None when the file is exhausted. The time
    column (and the device column) are removed from the reading.
    """

    def __init__(
        self,
        path: str | Path,
        format: str = "auto",
        time_column: str | None = None,
        device_column: str | None = None,
        device: str | None = None,
        realtime: bool = False,
        loop: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SourceError(f"replay file {self.path} does not exist")
        fmt = format
        if fmt == "auto":
            fmt = "jsonl" if self.path.suffix.lower() in (".jsonl", ".ndjson", ".json") else "csv"
        if fmt not in ("csv", "jsonl"):
            raise SourceError(f"replay format must be csv or jsonl, got {format!r}")
        if realtime and not time_column:
            raise SourceError("realtime replay needs time_column")
        self.format = fmt
        self.time_column = time_column
        self.device_column = device_column
        self.device = device
        self.realtime = realtime
        self.loop = loop
        self._sleep = sleep
        self._clock = clock
        self._rows: Iterator[dict[str, Any]] = self._iter()
        self._t0: tuple[float, float] | None = None  # (first row time, wall clock at it)
        self.line = 0

    @property
    def position(self) -> str:
        """Where the last reading came from: ``path:line`` (the line in the file, header = line 1)."""
        return f"{self.path}:{self.line}"

    def _iter(self) -> Iterator[dict[str, Any]]:
        with open(self.path, newline="") as fh:
            if self.format == "csv":
                reader = csv.DictReader(fh)
                for i, row in enumerate(reader, start=2):
                    self.line = i
                    yield {k: _coerce(v) for k, v in row.items() if k is not None}
            else:
                for i, line in enumerate(fh, start=1):
                    self.line = i
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise SourceError(f"{self.path}:{i}: not JSON: {exc}") from None
                    if not isinstance(obj, dict):
                        raise SourceError(f"{self.path}:{i}: each line must be a JSON object")
                    yield obj

    def _next_row(self) -> dict[str, Any] | None:
        for _ in range(2):
            for row in self._rows:
                if self.device_column and self.device is not None and str(row.get(self.device_column)) != self.device:
                    continue
                return row
            if not self.loop:
                return None
            self._rows = self._iter()
            self._t0 = None
        return None

    def read(self) -> dict[str, Any] | None:
        row = self._next_row()
        if row is None:
            return None
        if self.time_column:
            ts = row.pop(self.time_column, None)
            if self.realtime and isinstance(ts, (int, float)):
                if self._t0 is None:
                    self._t0 = (float(ts), self._clock())
                else:
                    due = self._t0[1] + (float(ts) - self._t0[0])
                    delay = due - self._clock()
                    if delay > 0:
                        self._sleep(delay)
        if self.device_column:
            row.pop(self.device_column, None)
        return row


# --- programmatic -------------------------------------------------------------------------------------------


class IterableSource:
    """Readings from any iterable of mappings (None when it is exhausted)."""

    def __init__(self, readings: Iterable[Reading]) -> None:
        self._it = iter(readings)

    def read(self) -> Reading | None:
        return next(self._it, None)


class CallableSource:
    """Readings from a zero-argument function (e.g. a sensor driver)."""

    def __init__(self, fn: Callable[[], Reading | None]) -> None:
        self._fn = fn

    def read(self) -> Reading | None:
        return self._fn()


class MergedSource:
    """Several sources as one: their readings merged (later sources win on a name clash); None if any is done."""

    def __init__(self, sources: list[Any]) -> None:
        if not sources:
            raise SourceError("no sources configured")
        self.sources = sources

    def read(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for s in self.sources:
            r = s.read()
            if r is None:
                return None
            out.update(r)
        return out

    @property
    def position(self) -> str | None:
        """The positions of the sources that have one (replay files), joined; None if none has."""
        found = [p for p in (source_position(s) for s in self.sources) if p]
        return ", ".join(found) or None

    def close(self) -> None:
        for s in self.sources:
            close = getattr(s, "close", None)
            if callable(close):
                close()


def source_position(source: Any) -> str | None:
    """Where ``source``'s last reading came from (``path:line`` for a replay file), or None if it cannot say."""
    pos = getattr(source, "position", None)
    return str(pos) if pos else None


# --- plugins and factory ------------------------------------------------------------------------------------


def load_plugin(spec: str) -> Any:
    """The object named by ``spec``: ``module:attr`` (or ``module.attr``), else an entry point of the group."""
    if ":" in spec:
        module, _, attr = spec.partition(":")
    else:
        from importlib.metadata import entry_points

        eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if eps:
            return eps[0].load()
        module, _, attr = spec.rpartition(".")
        if not module:
            raise SourceError(f"no source plugin {spec!r}: not an entry point in group {ENTRY_POINT_GROUP!r}")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise SourceError(f"source plugin {spec!r}: cannot import {module!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SourceError(f"source plugin {spec!r}: {module!r} has no attribute {attr!r}") from None
    return obj


def build_source(cfg: Any, device_id: str | None = None) -> Any:
    """One source from a :class:`edge_agent.config.SourceConfig`."""
    if cfg.kind == "system":
        return SystemMetrics(thermal_zone=cfg.thermal_zone, **cfg.options)
    if cfg.kind == "replay":
        return ReplaySource(
            cfg.path,
            format=cfg.format,
            time_column=cfg.time_column,
            device_column=cfg.device_column,
            device=device_id if cfg.device_column else None,
            realtime=cfg.realtime,
            loop=cfg.loop,
        )
    factory = load_plugin(cfg.plugin)
    if not callable(factory):
        raise SourceError(f"source plugin {cfg.plugin!r} is not callable")
    try:
        src = factory(**cfg.options)
    except TypeError as exc:
        raise SourceError(f"source plugin {cfg.plugin!r}: bad options {cfg.options}: {exc}") from None
    if not callable(getattr(src, "read", None)):
        raise SourceError(f"source plugin {cfg.plugin!r} returned {type(src).__name__} without a read() method")
    return src


def build_sources(cfgs: list[Any], device_id: str | None = None) -> Any:
    """All configured sources as one (a single source is returned as is)."""
    if not cfgs:
        raise SourceError("no [[sources]] configured and none given")
    sources = [build_source(c, device_id) for c in cfgs]
    return sources[0] if len(sources) == 1 else MergedSource(sources)
