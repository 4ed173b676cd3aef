"""In-process ingest metrics (thread-safe counters and a few gauges); the durable totals live in the store."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

__all__ = ["Metrics"]


class Metrics:
    """Counters since this process started: received, accepted, duplicates, rejected by reason, batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.received = 0
        self.accepted = 0
        self.duplicates = 0
        self.rejected: Counter[str] = Counter()
        self.batches = 0
        self.commit_seconds = 0.0
        self.last_commit: float | None = None
        self.connected = False
        #: wall time since when a batch keeps failing (store unreachable): ingest waits, nothing is acknowledged
        self.stalled_since: float | None = None
        self.failed_attempts = 0

    def record_failure(self) -> None:
        with self._lock:
            self.failed_attempts += 1
            if self.stalled_since is None:
                self.stalled_since = time.time()

    def record_batch(self, received: int, accepted: int, duplicates: int, rejected: Counter[str], seconds: float) -> None:
        with self._lock:
            self.received += received
            self.accepted += accepted
            self.duplicates += duplicates
            self.rejected.update(rejected)
            self.batches += 1
            self.commit_seconds += seconds
            self.last_commit = time.time()
            self.stalled_since = None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            elapsed = max(time.time() - self.started, 1e-9)
            return {
                "uptime_s": elapsed,
                "received": self.received,
                "accepted": self.accepted,
                "duplicates": self.duplicates,
                "rejected": dict(self.rejected),
                "rejected_total": sum(self.rejected.values()),
                "batches": self.batches,
                "mean_commit_ms": 1000 * self.commit_seconds / self.batches if self.batches else None,
                "last_commit": self.last_commit,
                "connected": self.connected,
                "stalled_since": self.stalled_since,
                "failed_attempts": self.failed_attempts,
            }
