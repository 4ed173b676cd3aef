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
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse



if TYPE_CHECKING:  # pragma: no cover
    from coordinator.service import Coordinator
    from coordinator.store import Store

log = logging.getLogger(__name__)

__all__ = ["ApiServer", "load_tokens", "default_token_file", "render_dashboard", "render_report", "stream_charts",
           "svg_band_chart", "svg_bar_chart"]


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
        return sum(self.store.report_counts(round_id).values())

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

W, H, PAD = 560, 220, 44


def _scale(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    margin = 0.05 * (hi - lo)
    return lo - margin, hi + margin


def _axes(title: str, ymin: float, ymax: float) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">',
           f"<title>{html.escape(title)}</title>",
           f'<text x="{PAD}" y="16" font-size="13" font-family="sans-serif">{html.escape(title)}</text>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#555"/>',
           f'<line x1="{PAD}" y1="28" x2="{PAD}" y2="{H - PAD}" stroke="#555"/>']
    for frac in (0.0, 0.5, 1.0):
        v = ymin + frac * (ymax - ymin)
        y = (H - PAD) - frac * (H - PAD - 28)
        out.append(f'<text x="{PAD - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end" '
                   f'font-family="sans-serif">{v:.3g}</text>')
    return out


def svg_band_chart(title: str, xlabels: list[str], est: list[float], lo: list[float], hi: list[float],
                   truth: list[float | None] | None = None) -> str:
    """Estimate over rounds (line + points) with the confidence band (shaded polygon); optionally the true values
    (dashed line, class ``truth``) for simulations and demos."""
    known = [t for t in (truth or []) if t is not None]
    ymin, ymax = _scale(list(lo) + list(hi) + list(est) + known)
    n = len(est)
    xs = [PAD + 10 + (i * (W - PAD - 30) / max(n - 1, 1)) for i in range(n)]

    def y(v: float) -> float:
        return (H - PAD) - (v - ymin) / (ymax - ymin) * (H - PAD - 28)

    out = _axes(title, ymin, ymax)
    band = [f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, hi)] + [f"{x:.1f},{y(v):.1f}" for x, v in zip(xs[::-1], lo[::-1])]
    out.append(f'<polygon class="band" points="{" ".join(band)}" fill="#9ecae1" fill-opacity="0.55" stroke="none"/>')
    out.append(f'<polyline class="est-line" points="{" ".join(f"{x:.1f},{y(v):.1f}" for x, v in zip(xs, est))}" '
               'fill="none" stroke="#08519c" stroke-width="2"/>')
    if truth is not None:
        pts = [f"{x:.1f},{y(t):.1f}" for x, t in zip(xs, truth) if t is not None]
        out.append(f'<polyline class="truth" points="{" ".join(pts)}" fill="none" stroke="#d62728" '
                   'stroke-width="1.5" stroke-dasharray="5,3"/>')
    for x, v, label in zip(xs, est, xlabels):
        out.append(f'<circle class="est" cx="{x:.1f}" cy="{y(v):.1f}" r="3" fill="#08519c"/>')
        out.append(f'<text x="{x:.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle" '
                   f'font-family="sans-serif">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def svg_bar_chart(title: str, labels: list[str], est: list[float], lo: list[float], hi: list[float],
                  truth: list[float] | None = None) -> str:
    """Frequencies as bars with confidence-interval whiskers; optionally true frequencies (red ticks, ``truth``)."""
    ymin, ymax = _scale([0.0] + list(lo) + list(hi) + list(est) + list(truth or []))
    n = len(est)
    slot = (W - PAD - 20) / max(n, 1)

    def y(v: float) -> float:
        return (H - PAD) - (v - ymin) / (ymax - ymin) * (H - PAD - 28)

    out = _axes(title, ymin, ymax)
    for i, (label, e, a, b) in enumerate(zip(labels, est, lo, hi)):
        x = PAD + 10 + i * slot
        top, base = y(max(e, 0.0)), y(0.0)
        out.append(f'<rect class="bar" x="{x:.1f}" y="{min(top, base):.1f}" width="{slot * 0.7:.1f}" '
                   f'height="{abs(base - top):.1f}" fill="#6baed6"/>')
        cx = x + slot * 0.35
        out.append(f'<line class="ci" x1="{cx:.1f}" y1="{y(a):.1f}" x2="{cx:.1f}" y2="{y(b):.1f}" stroke="#08306b"/>')
        if truth is not None and i < len(truth):
            out.append(f'<line class="truth" x1="{x:.1f}" y1="{y(truth[i]):.1f}" x2="{x + slot * 0.7:.1f}" '
                       f'y2="{y(truth[i]):.1f}" stroke="#d62728" stroke-width="2"/>')
        if n <= 40:
            out.append(f'<text x="{cx:.1f}" y="{H - PAD + 14}" font-size="9" text-anchor="middle" '
                       f'font-family="sans-serif">{html.escape(label[:10])}</text>')
    out.append("</svg>")
    return "\n".join(out)


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
        if kind in ("frequency", "longitudinal"):
            for rid, e in (series if every_round else series[-1:]):
                t = truth.get(rid, {}).get(stream)
                charts.append(svg_bar_chart(f"{stream} — {rid} (n={e['n']}, {e['mechanism']})", e["labels"],
                                            e["estimate"], e["ci_low"], e["ci_high"],
                                            t if t is not None and len(t) == len(e["estimate"]) else None))
            continue
        for j, dim in enumerate(series[-1][1]["labels"]):
            pts = [(rid, e) for rid, e in series if len(e["estimate"]) > j]
            tr = [truth.get(rid, {}).get(stream) for rid, _ in pts]
            tv = [t[j] if t is not None and len(t) > j else None for t in tr]
            charts.append(svg_band_chart(
                f"{stream}.{dim} — mean with {int(100 * pts[-1][1]['level'])}% band",
                [rid for rid, _ in pts], [e["estimate"][j] for _, e in pts],
                [e["ci_low"][j] for _, e in pts], [e["ci_high"][j] for _, e in pts],
                tv if any(v is not None for v in tv) else None))
    return charts


_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px} .charts svg{margin:6px;border:1px solid #eee}
td.num{text-align:right;font-variant-numeric:tabular-nums} .miss{color:#b00}"""


def render_report(title: str, history: list[tuple[str, dict[str, dict[str, Any]]]],
                  truth: dict[str, dict[str, list[float]]] | None = None, body_html: str = "") -> str:
    """A static HTML page (no refresh, no external assets) with ``body_html`` and the charts of
    :func:`stream_charts` (every round's frequencies, true values overlaid) — the demo's report."""
    charts = stream_charts(history, truth, every_round=True)
    legend = ('<p>Blue: estimate with its confidence band / whiskers. '
              '<span style="color:#d62728">Red: true value</span>.</p>') if truth else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
{body_html}
{legend}
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
