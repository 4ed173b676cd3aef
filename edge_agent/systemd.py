"""systemd notification protocol (sd_notify) without a dependency: a datagram to ``$NOTIFY_SOCKET``.

``READY=1`` once the agent is up, ``WATCHDOG=1`` at half the ``WatchdogSec`` interval (``$WATCHDOG_USEC``),
``STOPPING=1`` on shutdown, ``STATUS=...`` free text. Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time

__all__ = ["Notifier"]


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if addr:
            self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_watchdog = 0.0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, message: str) -> bool:
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall(message.encode())
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self, now: float | None = None) -> bool:
        """Send WATCHDOG=1 if half the watchdog interval has passed since the last one."""
        if self.watchdog_interval is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_watchdog < self.watchdog_interval:
            return False
        self._last_watchdog = now
        return self.notify("WATCHDOG=1")
