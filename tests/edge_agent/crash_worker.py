"""Zygote for the crash test: imports everything once, then forks a reporting child per command.

Protocol (stdin/stdout lines): ``go <delay_ms>`` → fork a child that opens the agent over STATE_DIR and reports
in a loop (offline: the outbox only; "publishing" = appending the outbox row to PUBLISHED then marking it sent);
after ``delay_ms`` the zygote SIGKILLs it and answers ``killed <pid> <status>``. ``quit`` ends.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

from edge_agent.agent import Agent
from edge_agent.config import Secrets
from edge_agent.embed import categorical, numeric, simple_config
from edge_agent.sources import CallableSource
from protocols import wire


def child(state_dir: Path, published: Path, secrets: Secrets) -> None:
    cfg = simple_config(
        "crash-dev",
        state_dir,
        [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 5)],
        [
            {"name": "cpu", "dimensions": ["cpu"], "mechanism": "hybrid", "epsilon": 0.5, "cap": 40.0},
            {"name": "env", "dimensions": ["cpu", "temp"], "mechanism": "ksampling"},
            {"name": "mode", "dimensions": ["mode"], "mechanism": "grr", "epsilon": 0.25},
        ],
        total_cap=1e9,
        outbox={"max_pending": 40},
    )
    rnd = int.from_bytes(os.urandom(4), "little")
    counter = [rnd]

    def reading():
        counter[0] += 1
        i = counter[0]
        return {"cpu": float((i * 37) % 120), "temp": 30.0 + (i % 7), "mode": i % 5}

    agent = Agent(cfg, CallableSource(reading), secrets=secrets, transport=False).open()
    fd = os.open(published, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    i = 0
    while True:
        agent.report(f"r{os.getpid()}-{i}")
        i += 1
        rows = agent.state.pending(limit=2)
        for row in rows:  # "publish": the network sees exactly what the outbox holds
            line = f"{row.seq} {hashlib.sha256(row.payload).hexdigest()} {row.payload.decode()}\n"
            os.write(fd, line.encode())
        agent.state.mark_sent([r.seq for r in rows])


def main() -> None:
    state_dir, published = Path(sys.argv[1]), Path(sys.argv[2])
    secrets = Secrets(wire.load_private_key(sys.argv[3]), bytes.fromhex(sys.argv[4]))
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        delay = float(cmd[1]) / 1000.0
        pid = os.fork()
        if pid == 0:
            try:
                child(state_dir, published, secrets)
            finally:
                os._exit(3)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        print(f"killed {pid} {status}", flush=True)


if __name__ == "__main__":
    main()
