"""A throwaway PostgreSQL server for the tests: Debian's PostgreSQL 15 binaries, a data directory in
a temporary directory, listening on 127.0.0.1 on a free port (its unix socket in that directory),
trust authentication for the ``postgres`` role. Started once per test session by the fixture in
``tests/conftest.py`` and stopped at its end; each test gets a database of its own.

As root the server runs as the ``postgres`` user (PostgreSQL refuses to run as root), through
``runuser``; as any other user it runs as that user. Durability settings are off (``fsync``,
``synchronous_commit``, ``full_page_writes``): a test server never outlives a crash.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("ISQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
"""Where initdb, pg_ctl and postgres are (``ISQ_PG_BIN`` overrides Debian's path)."""

ROLE = "postgres"
"""The database role the tests connect as (the superuser initdb creates)."""


def missing_binaries() -> str | None:
    """Why no server can be started here, or None when it can."""
    for name in ("initdb", "pg_ctl", "postgres"):
        if not (PG_BIN / name).is_file():
            return f"PostgreSQL is not installed here ({PG_BIN / name} is missing; set ISQ_PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as the postgres user"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One server in its own temporary directory; :meth:`start`, :meth:`database`, :meth:`stop`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="isq-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._names = itertools.count()
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [*(["runuser", "-u", "postgres", "--"] if self._as_root else []), *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.root, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): "
                               f"{done.stderr or done.stdout}")

    def start(self) -> None:
        if self._as_root:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", ROLE, "--auth=trust",
                  "--encoding=UTF8", "--locale=C.UTF-8")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """The URL of a new, empty database."""
        import psycopg

        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
