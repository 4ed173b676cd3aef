"""A child process a system test can crash (SIGKILL) or stop (SIGTERM, then SIGKILL after 30 s)."""

from __future__ import annotations

import signal
import subprocess


class ChildProcess:
    """Holds ``proc`` (a :class:`subprocess.Popen`, set by the subclass's start) and ends it on demand."""

    proc: subprocess.Popen | None = None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
