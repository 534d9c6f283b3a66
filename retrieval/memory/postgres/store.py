"""The memory's store on PostgreSQL: :class:`PostgresStore`, the SQLite store's API (same methods,
signatures, results, orderings and errors) over one database that any number of processes share.

It is composed of parts, one module each under :mod:`retrieval.memory.postgres`, mirroring the
SQLite store's: the turn log (``turn_log``), record reads (``reads``) and writes (``writes``),
evidence nodes (``evidence``), the array cache (``cache``), jobs (``jobs``), API keys (``keys``),
change markers (``versions``), the purge (``purge``) and the ``meta`` bindings (``meta``), over one
:class:`~retrieval.memory.postgres.database.Database` (the pool, write transactions and per-user
locks) and a schema brought up to date on open (``schema``).

Differences from the SQLite store: no writer lock file (``role`` is accepted and names nothing to
hold: several processes write, PostgreSQL serialises each user's writers); ``location`` is the URL
without its password and ``local_files`` is None (no directory on this machine); ``scrub`` cannot
rewrite the table files, :meth:`PostgresStore.compact` does (:mod:`retrieval.memory.postgres.purge`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from retrieval.memory.delegation import StoreParts
from retrieval.memory.postgres.cache import ArrayCache
from retrieval.memory.postgres.database import Database
from retrieval.memory.postgres.evidence import Evidence
from retrieval.memory.postgres.jobs import Jobs
from retrieval.memory.postgres.keys import KeyRow, Keys
from retrieval.memory.postgres.meta import Meta
from retrieval.memory.postgres.purge import Purge
from retrieval.memory.postgres.reads import Reads
from retrieval.memory.postgres.schema import SCHEMA_OBJECTS, SCHEMA_VERSION, foreign_objects, prepare
from retrieval.memory.postgres.turn_log import TurnLog
from retrieval.memory.postgres.versions import Versions
from retrieval.memory.postgres.writes import Writes


class PostgresStore(StoreParts):
    """The store in the PostgreSQL database at ``url`` (``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB``).

    Args:
        url: the database; its schema is created or migrated when opened for writing.
        read_only: refuse every write (a database without the schema is an error).
        role: the writer's role ("ingest", "consolidate"); kept for the SQLite store's signature.
    """

    def __init__(self, url: str, *, read_only: bool = False, role: str = "ingest") -> None:
        self.read_only, self.role, self._url = read_only, role, url
        self.db = Database(url, read_only=read_only, schema_version=SCHEMA_VERSION)
        try:
            prepare(self.db)
        except BaseException:
            self.db.close()
            raise
        self._reads = Reads(self.db)
        self._turns = TurnLog(self.db)
        self._writes = Writes(self.db, self._reads)
        self._evidence = Evidence(self.db)
        self._cache = ArrayCache(self.db)
        self._jobs = Jobs(self.db)
        self._versions = Versions(self.db)
        self._purge = Purge(self.db)
        self._meta = Meta(self.db)
        self._keys = Keys(self.db)

    @property
    def location(self) -> str:
        """The URL without its password (what messages name)."""
        return self.db.where

    @property
    def local_files(self) -> Path | None:
        """None: the store keeps no files on this machine."""
        return None

    def reopen(self, *, read_only: bool = False, role: str = "ingest") -> PostgresStore:
        """Another handle (its own pool) on the same database."""
        return PostgresStore(self._url, read_only=read_only, role=role)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def integrity_problems(self) -> list[str]:
        """The tables, indexes and triggers of the schema that are missing, and the objects it holds
        that the schema has not or holds otherwise (:func:`foreign_objects`) (empty: none)."""
        present = {row["name"] for row in self.db.rows(
            "SELECT relname AS name FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
            "UNION SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")}
        missing = [f"schema object {name!r} is missing" for name in SCHEMA_OBJECTS if name not in present]
        return missing + foreign_objects(self.db)

    def tracking(self, user_id: str) -> AbstractContextManager[list[tuple[Any, Any]]]:
        return self.db.tracking(user_id)

    @contextmanager
    def transaction(self, users: Collection[str]) -> Iterator[None]:
        with self.db.transaction(users):
            yield

    @property
    def concurrent_writers(self) -> bool:
        return True  # any number of server processes over one database

    def ingestion_lock(self, user_id: str, *, wait: bool,
                       capped: bool = False) -> AbstractContextManager[bool]:
        return self.db.ingestion_lock(user_id, wait=wait, capped=capped)

    def job_lock(self, job_id: int) -> AbstractContextManager[bool]:
        return self.db.job_lock(job_id)

    # -- API keys (the service's key rows; the SQLite store keeps them in a file beside it) ---------

    def add_key(self, key_id: str, user_id: str, salt: bytes, digest: bytes, created: str) -> None:
        self._keys.add_key(key_id, user_id, salt, digest, created)

    def live_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        return self._keys.live_key(key_id)

    def key_rows(self, user_id: str | None = None) -> list[KeyRow]:
        return self._keys.key_rows(user_id)

    def revoke_key(self, key_id: str, when: str) -> KeyRow | None:
        return self._keys.revoke_key(key_id, when)
