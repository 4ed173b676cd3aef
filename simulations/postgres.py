"""A throwaway PostgreSQL server on a free loopback port, for tests and benchmarks: ``initdb`` + ``pg_ctl`` in a
temporary directory, trust authentication, stopped and deleted on :meth:`ThrowawayPostgres.stop`.

    with ThrowawayPostgres() as pg:            # MissingPostgres if the server binaries are not installed
        dsn = pg.create_database("run1")       # postgresql://postgres@127.0.0.1:<port>/run1
        ... pg.cpu_seconds() ...               # CPU the server spent so far (postmaster, backends, helpers)

The server keeps PostgreSQL's durable defaults (``fsync=on``, ``synchronous_commit=on``): a committed batch is on
disk before the commit returns, as with the coordinator's SQLite store (``synchronous=FULL``). Run as root (CI
containers), ``initdb`` refuses to run, so the server runs as the ``postgres`` system user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from protocols.errors import MissingPostgres
from simulations.broker import free_port
from simulations.proc_stats import tree_cpu

__all__ = ["ThrowawayPostgres", "pg_bin"]


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, else Debian's newest ``/usr/lib/postgresql/<version>/bin``; or None."""
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(re.sub(r"\D", "", p.split("/")[4]) or 0), reverse=True)
    return shutil.which(name) or next(iter(versions), None)


class ThrowawayPostgres:
    """One PostgreSQL server in a temporary directory (see the module docstring)."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise MissingPostgres("PostgreSQL server binaries not installed (apt-get install postgresql)")
        self.prefix: list[str] = []
        self.uid: tuple[int, int] | None = None
        if os.geteuid() == 0:  # initdb refuses to run as root: use the postgres system user
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise MissingPostgres("running as root and there is no 'postgres' user to run the server") from None
            self.prefix, self.uid = ["runuser", "-u", "postgres", "--"], (pw.pw_uid, pw.pw_gid)
        self.workdir: Path | None = None
        self.port = 0

    def start(self) -> "ThrowawayPostgres":
        self.workdir = Path(tempfile.mkdtemp(prefix="haarvest-pg-"))
        if self.uid is not None:
            os.chown(self.workdir, *self.uid)
        self.port = free_port()
        data = self.workdir / "data"
        subprocess.run(self.prefix + [self.initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(self.prefix + [self.pg_ctl, "-D", str(data), "-l", str(self.workdir / "log"), "-w", "-o",
                                      f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=on",
                                      "start"],
                       check=True, stdout=subprocess.DEVNULL)
        return self

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (letters, digits, _); its DSN."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"bad database name {name!r}")
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server so far: the postmaster, its live children (backends, checkpointer,
        WAL writer, …) and the children it has reaped (backends of closed connections)."""
        assert self.workdir is not None
        pid = int((self.workdir / "data" / "postmaster.pid").read_text().split()[0])
        return tree_cpu(pid, reaped=True)

    def stop(self) -> None:
        if self.workdir is None:
            return
        subprocess.run(self.prefix + [self.pg_ctl, "-D", str(self.workdir / "data"), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    def __enter__(self) -> "ThrowawayPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
