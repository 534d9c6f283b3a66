"""Consolidation in the background, beside ingestion (MemCode: "off the online path, never
blocking it").

:class:`ConsolidationWorker` is a thread with its own store connection, opened in the
``consolidate`` role (its own writer lock; SQLite in WAL mode serialises its short transactions
with the ingest's, and the store's busy timeout makes either wait rather than fail). It runs
rounds over the store's conversations until stopped (a round skips a conversation to which nothing
was committed since its last consolidation), then one final round, so everything ingested before
:meth:`~ConsolidationWorker.stop` is consolidated. Ingestion never waits for a round: the
worker only reads what is committed and writes one forwarding transaction at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from isq.codes import Fingerprint
from retrieval.consolidation.config import WORKER_INTERVAL_S, ConsolidationConfig
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.operations import OfflineOperator, Operator
from retrieval.consolidation.report import ConsolidationReport
from retrieval.index.model_thread import on_model_thread
from retrieval.memory.backends import open_store
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.store_contract import Store


class SerializedEmbedder:
    """An embedder shared by several threads: each ``encode`` runs on the model thread
    (:mod:`retrieval.index.model_thread`), one at a time (a fast tokenizer refuses concurrent
    use). Its identity is the wrapped embedder's, so stores see the same model."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.identity = model_identity(embedder)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return on_model_thread(lambda: self.embedder.encode(texts))


class SerializedFingerprinter:
    """A fingerprinter shared by several threads, as :class:`SerializedEmbedder`: each
    ``fingerprint`` call on the model thread; ``identity`` and ``codebook_size`` pass through."""

    def __init__(self, fingerprinter: TextFingerprinter) -> None:
        self.fingerprinter = fingerprinter
        self.identity, self.codebook_size = fingerprinter.identity, fingerprinter.codebook_size

    def fingerprint(self, texts: Sequence[str]) -> list[Fingerprint]:
        return on_model_thread(lambda: self.fingerprinter.fingerprint(texts))


class ConsolidationWorker:
    """Background consolidation of the conversations (all, or ``conversations``) of ``store``, a
    store directory or URL (:func:`retrieval.memory.backends.open_store`).

    Use as a context manager around an ingest, or call :meth:`start` and :meth:`stop`. Share the
    ingest's embedder through :class:`SerializedEmbedder`. :attr:`reports` holds one report per
    conversation, summed over the rounds. An error in the thread is raised again by :meth:`stop`.
    """

    def __init__(self, store: str | Path, embedder: Embedder, operator: Operator | None = None,
                 config: ConsolidationConfig | None = None, *, fingerprinter: TextFingerprinter | None = None,
                 conversations: Sequence[str] | None = None, interval_s: float = WORKER_INTERVAL_S) -> None:
        self.target = store
        self.embedder, self.operator, self.config = embedder, operator or OfflineOperator(), config
        self.fingerprinter, self.conversations, self.interval_s = fingerprinter, conversations, interval_s
        self.reports: dict[str, ConsolidationReport] = {}
        self.rounds = 0
        self.error: BaseException | None = None
        self._stop, self._abort = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="consolidation", daemon=True)
        self._store: Store | None = None
        # each conversation's ingestion marks (segments, records, purges) after its last run: a
        # purge and an add that leave the record count alone still change them
        self._marks: dict[str, tuple[int, ...]] = {}

    def start(self) -> ConsolidationWorker:
        """Open the store (a second consolidation of it is refused here, :class:`StoreBusy`) and
        start the thread."""
        self._store = open_store(self.target, role="consolidate")
        self._thread.start()
        return self

    def stop(self, final_round: bool = True) -> dict[str, ConsolidationReport]:
        """Finish: one last round over everything committed (unless ``final_round`` is False),
        then wait for the thread; returns :attr:`reports`."""
        if not final_round:
            self._abort.set()
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.reports

    def __enter__(self) -> ConsolidationWorker:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(final_round=exc_type is None)

    def _run(self) -> None:
        assert self._store is not None
        try:
            embedder = CachedEmbedder(self.embedder, self._store)
            while not self._abort.is_set():
                last = self._stop.is_set()  # set before this round began: the round sees every commit
                self._round(embedder)
                if last:
                    break
                self._stop.wait(self.interval_s)
        except BaseException as err:  # noqa: BLE001 - handed to the caller by stop()
            self.error = err
        finally:
            self._store.close()

    def _round(self, embedder: CachedEmbedder) -> None:
        assert self._store is not None
        stored = self._store.users_with_segments()
        for user_id in [c for c in self.conversations or stored if c in stored]:
            if self._abort.is_set():
                return
            segments, records, purges = self._store.ingestion_marks(user_id)
            if (segments, records, purges) == self._marks.get(user_id):
                continue  # nothing committed since this conversation's last consolidation
            report = consolidate_user(self._store, user_id, embedder, self.operator,
                                      self.config, fingerprinter=self.fingerprinter)
            # the run's own records counted; anything committed meanwhile differs from the store's
            self._marks[user_id] = (segments, records + report.created, purges)
            if user_id in self.reports:
                self.reports[user_id].absorb(report)
            else:
                self.reports[user_id] = report
        self.rounds += 1
