"""HTTP JSON API and a dashboard page (stdlib ``ThreadingHTTPServer``, no framework, no external assets).

Routes (GET):

* ``/healthz`` — ``{"status": "ok" | "stalled", "mqtt_connected": …, "stalled_since": …}`` (``stalled``, with HTTP
  503: a batch of reports keeps failing to commit — ingest is waiting for the store, nothing is acknowledged).
  The only route open without a token (a liveness probe reveals nothing about the fleet);
* ``/api/rounds`` — every round (status, ε, streams, the signed configuration); ``/api/rounds/<id>`` — one;
* ``/api/estimates/<round>`` — estimates with confidence intervals per stream (query: ``level``, ``variance``
  = plugin|worst, ``consistency`` = 0|1);
* ``/api/devices`` — every enrolled device: status (``quarantined`` included), contract, stored reports, receipts
  and rejections by reason;
* ``/api/metrics`` — ingest counters of this process and the durable totals;
* ``/metrics`` — the same, per-device rejections, round progress and the latest estimates with their intervals,
  in the Prometheus text format (:mod:`coordinator.prometheus`);
* ``/`` — the dashboard: per stream and dimension, the estimate over rounds with its confidence band, and the
  latest round's frequencies with interval whiskers, as inline SVG rendered on the server.

**Locked.** Every route but ``/healthz`` needs a bearer token (``Authorization: Bearer <token>``, or
``?token=<token>`` so that a browser can open the dashboard): one of the lines of the token file
(:func:`load_tokens`; by default ``<db>.api-token`` beside a SQLite database, created with a random token, mode
0600). Without one: HTTP 401. Tokens are compared in constant time.

**Ingest first.** The API never blocks or starves ingest: it reads through its own store connection (SQLite WAL
readers do not block the writer; PostgreSQL: its own session); at most ``max_threads`` requests are served at once
(HTTP 503 beyond); a client that sends nothing for ``request_timeout`` seconds is dropped; estimates are computed
one at a time and cached (at most ``cache_size`` entries, least recently used out). A cached estimate is served
until the round's number of stored reports changes — and, while reports keep arriving, for at least
``max(min_refresh_s, 2 × the time it took)``: the page is then at most that stale, and the API spends at most
about a third of the process's time on estimates however many clients poll it.
"""

from __future__ import annotations

import hmac
import html
import logging
import json
import math
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import parse_qs, urlparse



if TYPE_CHECKING:  # pragma: no cover
    from coordinator.service import Coordinator
    from coordinator.store import Store

log = logging.getLogger(__name__)

__all__ = ["ApiServer", "load_tokens", "default_token_file", "render_dashboard", "render_report", "stream_charts",
           "svg_band_chart", "svg_bar_chart", "nice_ticks"]


def default_token_file(db: str) -> Path | None:
    """``<db>.api-token`` for a SQLite database file; None for ``:memory:`` and PostgreSQL."""
    if db == ":memory:" or db.startswith(("postgresql://", "postgres://")):
        return None
    return Path(db[len("sqlite:///"):] if db.startswith("sqlite:///") else db).with_suffix(".api-token")


def load_tokens(path: str | Path | None, create: bool = True) -> list[str]:
    """The API tokens in ``path`` (one per line; blank lines and ``#`` comments ignored). A missing file is created
    with one random token (mode 0600) when ``create``; None gives one ephemeral token. ValueError if the file
    holds no token or a token shorter than 16 characters."""
    if path is None:
        return [secrets.token_urlsafe(24)]
    p = Path(path)
    if not p.exists() and create:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24) + "\n")
    tokens = [line.strip() for line in p.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not tokens or any(len(t) < 16 for t in tokens):
        raise ValueError(f"API token file {p}: needs one token per line, each at least 16 characters")
    return tokens


def _reader_store(coordinator: "Coordinator") -> tuple["Store", bool]:
    """A store connection of the API's own (and whether it is to be closed), or the coordinator's if its database
    cannot be opened twice (``:memory:``)."""
    from coordinator.store import PostgresStore, SQLiteStore

    store = coordinator.store
    if isinstance(store, SQLiteStore) and store.path != ":memory:":
        return SQLiteStore(store.path), True
    if isinstance(store, PostgresStore):
        return PostgresStore(store.dsn), True
    return store, False


class _BoundedServer(ThreadingHTTPServer):
    """A thread per request, at most ``max_threads`` at once: beyond, an immediate 503 and the connection closed."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_threads: int) -> None:
        self._slots = threading.BoundedSemaphore(max_threads)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n"
                                b"Retry-After: 1\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is not an error worth a traceback; anything else is logged."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        log.exception("API request from %s failed", client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class ApiServer:
    """Serves the API for a :class:`coordinator.service.Coordinator` on a background thread (see the module
    docstring for authentication and the limits)."""

    def __init__(self, coordinator: "Coordinator", host: str = "127.0.0.1", port: int = 0, *,
                 tokens: list[str] | None = None, max_threads: int = 8, request_timeout: float = 10.0,
                 cache_size: int = 256, min_refresh_s: float = 2.0) -> None:
        from coordinator.rounds import RoundManager

        if max_threads < 1 or request_timeout <= 0 or cache_size < 1 or min_refresh_s < 0:
            raise ValueError("max_threads and cache_size must be >= 1, request_timeout > 0, min_refresh_s >= 0")
        self.coordinator = coordinator
        self.tokens = [t.encode() for t in (tokens or load_tokens(None))]
        self.store, self._own_store = _reader_store(coordinator)
        self.rounds = RoundManager(self.store, coordinator.key)  # reads only: never publishes
        self.cache_size, self.min_refresh_s = cache_size, min_refresh_s
        self._cache: OrderedDict[tuple, tuple[int, float, float, dict[str, Any]]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._compute_lock = threading.Lock()  # one estimate computation at a time
        handler = type("Handler", (_Handler,), {"api": self, "timeout": request_timeout})
        self.httpd = _BoundedServer((host, port), handler, max_threads)
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> str:
        """The first API token (for the dashboard link a demo prints)."""
        return self.tokens[0].decode()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="haarvest-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(5)
        if self._own_store:
            self.store.close()

    def authorized(self, header: str | None, query_token: str | None) -> bool:
        given = None
        if header and header.startswith("Bearer "):
            given = header[len("Bearer "):].strip()
        elif query_token:
            given = query_token
        if not given:
            return False
        raw = given.encode()
        return any(hmac.compare_digest(raw, t) for t in self.tokens)

    def _round_count(self, round_id: str) -> int:
        return self.store.round_report_count(round_id)

    def _cached(self, key: tuple, count: int) -> dict[str, Any] | None:
        """The cached estimates for ``key`` if still good: same number of stored reports, or younger than
        max(min_refresh_s, 2 × the time they took)."""
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            self._cache.move_to_end(key)
            n, at, took, result = hit
            return result if n == count or time.monotonic() - at < max(self.min_refresh_s, 2 * took) else None

    def estimates(self, round_id: str, level: float = 0.95, variance: str = "plugin",
                  consistency: bool = True) -> dict[str, Any]:
        """Estimates as JSON, cached (see the module docstring)."""
        from coordinator.estimate import estimate_round

        key = (round_id, level, variance, consistency)
        count = self._round_count(round_id)
        fresh = self._cached(key, count)
        if fresh is not None:  # a hit never waits behind another round's computation
            return fresh
        with self._compute_lock:
            fresh = self._cached(key, count)  # computed meanwhile by the request we waited for
            if fresh is not None:
                return fresh
            t0 = time.monotonic()
            result = {k: v.to_dict() for k, v in
                      estimate_round(self.store, round_id, level, variance, consistency).items()}  # type: ignore[arg-type]
            with self._cache_lock:
                self._cache[key] = (count, time.monotonic(), time.monotonic() - t0, result)
                self._cache.move_to_end(key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return result


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    server_version = "haarvest-coordinator"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        return

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj, indent=1, allow_nan=False).encode(), "application/json", headers)

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        api = self.api
        coord = api.coordinator
        try:
            if parts == ["healthz"]:
                metrics = coord.ingest.metrics if coord.ingest else None
                stalled = metrics.stalled_since if metrics else None
                self._json({"status": "ok" if stalled is None else "stalled",
                            "mqtt_connected": metrics.connected if metrics else None, "stalled_since": stalled},
                           status=200 if stalled is None else 503)
            elif not api.authorized(self.headers.get("Authorization"), query.get("token")):
                self._json({"error": "authentication required: Authorization: Bearer <token> (the API token file)"},
                           401, {"WWW-Authenticate": 'Bearer realm="haarvest"'})
            elif parts == ["api", "rounds"]:
                self._json(api.rounds.list())
            elif len(parts) == 3 and parts[:2] == ["api", "rounds"]:
                self._json(json.loads(api.rounds.get(parts[2]).to_bytes()))
            elif len(parts) == 3 and parts[:2] == ["api", "estimates"]:
                level = float(query.get("level", 0.95))
                variance = query.get("variance", "plugin")
                if variance not in ("plugin", "worst") or not 0 < level < 1:
                    raise ValueError("level must lie in (0, 1) and variance be plugin or worst")
                self._json(api.estimates(parts[2], level, variance, query.get("consistency", "1") != "0"))
            elif parts == ["api", "devices"]:
                from coordinator.service import device_rows

                self._json(device_rows(api.store))
            elif parts == ["metrics"]:
                from coordinator import prometheus

                self._send(200, prometheus.render(api), prometheus.CONTENT_TYPE_LATEST)
            elif parts == ["api", "metrics"]:
                self._json(coord.metrics_snapshot(api.store))
            elif parts in ([], ["dashboard"]):
                self._send(200, render_dashboard(api).encode(), "text/html; charset=utf-8")
            else:
                self._json({"error": "not found"}, 404)
        except ValueError as exc:
            self._json({"error": str(exc)}, 404 if "unknown round" in str(exc) else 400)


# ---------------------------------------------------------------------- SVG rendering

W, H, PAD = 560, 240, 56
TOP, BOTTOM = 30, 40  # plot area: y from TOP to H - BOTTOM, x from PAD to W - 12
_FONT = 'font-family="sans-serif"'


def nice_ticks(lo: float, hi: float, count: int = 5) -> tuple[list[float], int]:
    """Round axis ticks covering [lo, hi]: multiples of 1, 2, 2.5 or 5 × 10^k, about ``count`` of them; and the
    number of decimals that prints them exactly (0.4, 0.45 — not 0.402)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9) * step
    ticks = [first + i * step for i in range(int(math.ceil((hi - first) / step - 1e-9)) + 1)]
    decimals = max(0, -int(math.floor(math.log10(step) + 1e-9)))
    if abs(round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6:  # 2.5 × 10^k needs one more
        decimals += 1
    return [round(t, decimals + 2) for t in ticks], decimals


def _y_of(ticks: list[float]) -> Callable[[float], float]:
    """The plot's y coordinate of a value, for an axis from the first tick to the last."""
    ymin, ymax = ticks[0], ticks[-1]
    return lambda v: (H - BOTTOM) - (v - ymin) / (ymax - ymin) * (H - BOTTOM - TOP)


def _axes(title: str, ticks: list[float], decimals: int, ylabel: str, percent: bool = False) -> list[str]:
    """The frame: title, y ticks with grid lines, the y-axis label."""
    y_of = _y_of(ticks)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">',
           f"<title>{html.escape(title)}</title>",
           f'<text x="{PAD}" y="16" font-size="13" {_FONT}>{html.escape(title)}</text>']
    for t in ticks:
        y = y_of(t)
        label = f"{100 * t:.{max(decimals - 2, 0)}f}%" if percent else f"{t:,.{decimals}f}"
        out.append(f'<line class="grid" x1="{PAD}" y1="{y:.1f}" x2="{W - 12}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text class="tick" x="{PAD - 5}" y="{y + 4:.1f}" font-size="10" text-anchor="end" {_FONT}>'
                   f"{label}</text>")
    out.append(f'<line x1="{PAD}" y1="{H - BOTTOM}" x2="{W - 12}" y2="{H - BOTTOM}" stroke="#555"/>')
    out.append(f'<line x1="{PAD}" y1="{TOP}" x2="{PAD}" y2="{H - BOTTOM}" stroke="#555"/>')
    mid = (TOP + H - BOTTOM) / 2
    out.append(f'<text class="ylabel" x="12" y="{mid:.1f}" font-size="10" text-anchor="middle" {_FONT} '
               f'transform="rotate(-90 12 {mid:.1f})">{html.escape(ylabel)}</text>')
    return out


def _close(out: list[str], estimate: tuple[str, str], interval_mark: str, level: float,
           truth: tuple[str, str] | None) -> str:
    """The chart's one-line legend under the plot — estimate, interval, and the truth when drawn; each item an svg
    snippet drawn in a 16×10 box at the origin and its text — and the closing tag."""
    items = [estimate, (interval_mark, f"{int(round(100 * level))}% interval")] + ([truth] if truth else [])
    out.append(f'<g class="legend" transform="translate(0,{H - 12})">')
    x = float(PAD)
    for mark, text in items:
        out.append(f'<g transform="translate({x:.1f},-8)">{mark}</g>')
        out.append(f'<text x="{x + 20:.1f}" y="0" font-size="10" {_FONT}>{html.escape(text)}</text>')
        x += 28 + 5.6 * len(text)
    out += ["</g>", "</svg>"]
    return "\n".join(out)


_EST_MARK = ('<line x1="0" y1="5" x2="16" y2="5" stroke="#08519c" stroke-width="2"/>'
             '<circle cx="8" cy="5" r="3" fill="#08519c"/>')
_BAND_MARK = ('<rect x="0" y="0" width="16" height="10" fill="#9ecae1" fill-opacity="0.55"/>'
              '<line x1="8" y1="0" x2="8" y2="10" stroke="#08306b"/>')
_TRUTH_LINE = '<line x1="0" y1="5" x2="16" y2="5" stroke="#d62728" stroke-width="1.5" stroke-dasharray="5,3"/>'
_BAR_MARK = '<rect x="2" y="0" width="12" height="10" fill="#6baed6"/>'
_WHISKER = '<line x1="8" y1="0" x2="8" y2="10" stroke="#08306b"/><line x1="5" y1="0" x2="11" y2="0" stroke="#08306b"/>'
_TRUTH_TICK = '<line x1="0" y1="5" x2="16" y2="5" stroke="#d62728" stroke-width="2"/>'


def svg_band_chart(title: str, xlabels: list[str], est: list[float], lo: list[float], hi: list[float],
                   truth: list[float | None] | None = None, *, ylabel: str = "value", level: float = 0.95) -> str:
    """Estimate over rounds (line + points) with its confidence interval at every point (a whisker, and a shaded
    band between points); optionally the true values (dashed line, class ``truth``) for simulations and demos.
    Round y ticks, the y-axis label ``ylabel`` (the quantity and its unit) and a legend."""
    known = [t for t in (truth or []) if t is not None]
    ticks, decimals = nice_ticks(min(list(lo) + list(est) + known), max(list(hi) + list(est) + known))
    y = _y_of(ticks)
    n = len(est)
    width = W - PAD - 40
    xs = [PAD + 20 + (i * width / (n - 1) if n > 1 else width / 2) for i in range(n)]

    out = _axes(title, ticks, decimals, ylabel)
    if n > 1:
        band = ([f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, hi)]
                + [f"{x:.1f},{y(v):.1f}" for x, v in zip(xs[::-1], lo[::-1])])
        out.append(f'<polygon class="band" points="{" ".join(band)}" fill="#9ecae1" fill-opacity="0.55" '
                   'stroke="none"/>')
    for x, a, b in zip(xs, lo, hi):
        out.append(f'<line class="ci" x1="{x:.1f}" y1="{y(a):.1f}" x2="{x:.1f}" y2="{y(b):.1f}" stroke="#08306b"/>')
        for v in (a, b):
            out.append(f'<line class="ci-cap" x1="{x - 4:.1f}" y1="{y(v):.1f}" x2="{x + 4:.1f}" y2="{y(v):.1f}" '
                       'stroke="#08306b"/>')
    out.append(f'<polyline class="est-line" points="{" ".join(f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, est))}" '
               'fill="none" stroke="#08519c" stroke-width="2"/>')
    if truth is not None:
        pts = [f"{x:.1f},{y(t):.1f}" for x, t in zip(xs, truth) if t is not None]
        if len(pts) == 1:  # a single round: a short dashed tick at the point
            x0, y0 = pts[0].split(",")
            out.append(f'<line class="truth" x1="{float(x0) - 14:.1f}" y1="{y0}" x2="{float(x0) + 14:.1f}" y2="{y0}" '
                       'stroke="#d62728" stroke-width="1.5" stroke-dasharray="5,3"/>')
        else:
            out.append(f'<polyline class="truth" points="{" ".join(pts)}" fill="none" stroke="#d62728" '
                       'stroke-width="1.5" stroke-dasharray="5,3"/>')
    for x, v, label in zip(xs, est, xlabels):
        out.append(f'<circle class="est" cx="{x:.1f}" cy="{y(v):.1f}" r="3" fill="#08519c"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 13}" font-size="10" text-anchor="middle" '
                   f'{_FONT}>{html.escape(label)}</text>')
    return _close(out, (_EST_MARK, "estimate"), _BAND_MARK, level,
                  None if truth is None else (_TRUTH_LINE, "true value"))


def svg_bar_chart(title: str, labels: list[str], est: list[float], lo: list[float], hi: list[float],
                  truth: list[float] | None = None, *, level: float = 0.95) -> str:
    """Frequencies (share of devices, in %) as bars with confidence-interval whiskers; optionally the true
    frequencies (red ticks, class ``truth``). Round y ticks, an axis label and a legend."""
    ticks, decimals = nice_ticks(min([0.0] + list(lo) + list(est) + list(truth or [])),
                                 max([0.0] + list(hi) + list(est) + list(truth or [])))
    y = _y_of(ticks)
    n = len(est)
    slot = (W - PAD - 20) / max(n, 1)

    out = _axes(title, ticks, decimals, "share of devices", percent=True)
    for i, (label, e, a, b) in enumerate(zip(labels, est, lo, hi)):
        x = PAD + 10 + i * slot
        top, base = y(max(e, 0.0)), y(0.0)
        out.append(f'<rect class="bar" x="{x:.1f}" y="{min(top, base):.1f}" width="{slot * 0.7:.1f}" '
                   f'height="{abs(base - top):.1f}" fill="#6baed6"><title>{html.escape(label)}: '
                   f"{100 * e:.1f}% [{100 * a:.1f}%, {100 * b:.1f}%]</title></rect>")
        cx = x + slot * 0.35
        out.append(f'<line class="ci" x1="{cx:.1f}" y1="{y(a):.1f}" x2="{cx:.1f}" y2="{y(b):.1f}" stroke="#08306b"/>')
        if truth is not None and i < len(truth):
            out.append(f'<line class="truth" x1="{x:.1f}" y1="{y(truth[i]):.1f}" x2="{x + slot * 0.7:.1f}" '
                       f'y2="{y(truth[i]):.1f}" stroke="#d62728" stroke-width="2"/>')
        if n <= 40:
            out.append(f'<text x="{cx:.1f}" y="{H - BOTTOM + 13}" font-size="9" text-anchor="middle" '
                       f'{_FONT}>{html.escape(label[:12])}</text>')
    return _close(out, (_BAR_MARK, "estimate"), _WHISKER, level,
                  None if truth is None else (_TRUTH_TICK, "true share"))


def stream_charts(history: list[tuple[str, dict[str, dict[str, Any]]]],
                  truth: dict[str, dict[str, list[float]]] | None = None, every_round: bool = False) -> list[str]:
    """SVG charts from ``[(round_id, {stream: StreamEstimate.to_dict()})]`` (oldest first): per numeric stream and
    dimension the estimate over rounds with its band; per frequency stream the latest round's bars (every round's
    with ``every_round``). ``truth[round_id][stream]`` (optional) overlays the true values."""
    truth = truth or {}
    charts: list[str] = []
    streams = sorted({s for _, est in history for s in est})
    for stream in streams:
        series = [(rid, est[stream]) for rid, est in history if stream in est and est[stream].get("error") is None]
        if not series:
            continue
        kind = series[-1][1]["kind"]
        if kind == "distribution":
            for rid, e in (series if every_round else series[-1:]):
                charts.append(_cdf_chart(stream, rid, e, truth.get(rid, {}).get(stream)))
            continue
        if kind in ("frequency", "longitudinal"):
            for rid, e in (series if every_round else series[-1:]):
                t = truth.get(rid, {}).get(stream)
                charts.append(svg_bar_chart(f"{stream} — {rid} (n={e['n']}, {e['mechanism']})", e["labels"],
                                            e["estimate"], e["ci_low"], e["ci_high"],
                                            t if t is not None and len(t) == len(e["estimate"]) else None,
                                            level=float(e.get("level", 0.95))))
            continue
        for j, dim in enumerate(series[-1][1]["labels"]):
            pts = [(rid, e) for rid, e in series if len(e["estimate"]) > j]
            tr = [truth.get(rid, {}).get(stream) for rid, _ in pts]
            tv = [t[j] if t is not None and len(t) > j else None for t in tr]
            units = series[-1][1].get("units") or []
            unit = units[j] if j < len(units) and units[j] else ""
            charts.append(svg_band_chart(
                f"{stream}.{dim} — fleet mean per round (n={pts[-1][1]['n']}, {pts[-1][1]['mechanism']})",
                [rid for rid, _ in pts], [e["estimate"][j] for _, e in pts],
                [e["ci_low"][j] for _, e in pts], [e["ci_high"][j] for _, e in pts],
                tv if any(v is not None for v in tv) else None,
                ylabel=f"mean {dim}" + (f" ({unit})" if unit else ""), level=float(pts[-1][1].get("level", 0.95))))
    return charts


#: Most bucket edges labelled on a CDF chart's x axis (more overlap at the chart's width).
_CDF_LABELS = 8


def _cdf_chart(stream: str, rid: str, e: dict[str, Any], truth: list[float] | None) -> str:
    """A distribution stream's consistent CDF at the right bucket edges with its monotone band (the CDF itself where
    the mechanism has no analytic variance); ``truth`` (optional) the true CDF at the same edges."""
    cdf = [float(v) for v in e["cdf"]]
    lo = [float(v) for v in e.get("cdf_low") or cdf]
    hi = [float(v) for v in e.get("cdf_high") or cdf]
    units = e.get("units") or []
    unit = f" ({units[0]})" if units and units[0] else ""
    qs = ", ".join(f"p{100 * q['q']:g} = {q['value']:.4g}" for q in e.get("quantiles") or [])
    right = e["edges"][1:]
    step = max(1, math.ceil(len(right) / _CDF_LABELS))  # every step-th edge labelled, ending at the upper bound
    labels = [f"{x:.4g}" if (len(right) - 1 - j) % step == 0 else "" for j, x in enumerate(right)]
    return svg_band_chart(f"{stream} — CDF, {rid} (n={e['n']}, {e['mechanism']}){': ' + qs if qs else ''}",
                          labels, cdf, lo, hi,
                          list(truth) if truth is not None and len(truth) == len(cdf) else None,
                          ylabel=f"fraction ≤ value{unit}", level=float(e.get("level", 0.95)))


_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px} .charts svg{margin:6px;border:1px solid #eee}
td.num{text-align:right;font-variant-numeric:tabular-nums} .miss{color:#b00}"""


def render_report(title: str, history: list[tuple[str, dict[str, dict[str, Any]]]],
                  truth: dict[str, dict[str, list[float]]] | None = None, body_html: str = "") -> str:
    """A static HTML page (no refresh, no external assets) with ``body_html`` and the charts of
    :func:`stream_charts` (every round's frequencies, true values overlaid) — the demo's report."""
    charts = stream_charts(history, truth, every_round=True)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
{body_html}
<div class="charts">{''.join(charts) if charts else '<p>No estimates.</p>'}</div>
</body></html>"""


def render_dashboard(api: ApiServer, max_rounds: int = 30) -> str:
    coord = api.coordinator
    rounds = api.rounds.list()[-max_rounds:]
    per_round = {r["round_id"]: api.estimates(r["round_id"]) for r in rounds}
    charts = stream_charts(list(per_round.items()))
    snap = coord.metrics_snapshot(api.store)
    rows = "".join(
        f"<tr><td>{html.escape(r['round_id'])}</td><td>{r['status']}</td><td>{r['epsilon']:g}</td>"
        f"<td>{html.escape(', '.join(r['streams']))}</td><td>{html.escape(', '.join(r['depends_on']))}</td></tr>"
        for r in rounds)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>haarvest coordinator</title>
<style>{_STYLE}</style>
</head><body>
<h1>haarvest coordinator</h1>
<p id="metrics">accepted {snap['accepted']} · duplicates {snap['duplicates']} · rejected {snap['rejected_total']}
· stored {snap['stored_reports']} · devices {snap['devices']} · open rounds {snap['open_rounds']}</p>
<table><tr><th>round</th><th>status</th><th>ε</th><th>streams</th><th>depends on</th></tr>{rows}</table>
<div class="charts">{''.join(charts) if charts else '<p>No estimates yet.</p>'}</div>
</body></html>"""
