"""The one thread that runs this process's model forwards, and loads the models.

torch runs a forward's operators on an OpenMP team: the calling thread and the intra-op threads
it keeps, one team per thread that has called. GNU OpenMP (the libgomp torch ships) counts the
threads of every team in the process, and while they outnumber the machine's cores, a team
thread waiting at a barrier spins about a hundred rounds, then sleeps: every operator of a forward
then waits for a thread to be woken. A team goes when its thread ends. On the team's 2-core
machine a second team (a forward on one more thread, or a model loaded on one) made one short
query's forward 2.1x as slow and a segment's texts 1.35x (``docs/performance.md``, "One OpenMP
team"); ``OMP_WAIT_POLICY=PASSIVE``, always sleeping, is as slow with one team as with several.

So the memory loads its models (loading runs torch operators too) and runs every forward of its
encoders on this one thread: the other threads (a server's request threads, the ingestion worker,
the query batcher's) hand it the call and wait for it. It runs one call at a time, in arrival
order. Its results are the ones the calling thread would get, bit for bit: the same operators on
as many threads. A call made on the thread itself runs at once.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Call(Generic[T]):
    """One call handed to the thread, and what became of it."""

    def __init__(self, function: Callable[[], T]) -> None:
        self.function, self.caller = function, threading.current_thread()
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


class ModelThread:
    """A daemon thread, started by the first call, that runs the calls handed to it in turn."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._calls: queue.SimpleQueue[_Call[object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._caller: threading.Thread | None = None  # the thread whose call runs now

    def run(self, function: Callable[[], T]) -> T:
        """``function()``, run on the thread; its error is raised here."""
        if self.is_current():
            return function()
        call = _Call(function)
        with self._mutex:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="model-forwards", daemon=True)
                self._thread.start()
            self._calls.put(call)  # type: ignore[arg-type]
        try:
            call.done.wait()
        except BaseException:  # an interrupt (Ctrl-C) while the call runs: it finishes first, so
            call.done.wait()  # the interpreter never exits with a forward in flight (torch aborts)
            raise
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            self._caller = call.caller
            try:
                call.result = call.function()
            except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
                call.error = err
            finally:
                self._caller = None
                call.done.set()
                del call  # not held while idle: its result may be large

    def is_current(self) -> bool:
        """Whether the calling thread is the model thread."""
        return threading.current_thread() is self._thread

    def calling_thread(self) -> threading.Thread:
        """On the thread, the one that handed it the call now running; elsewhere, the current one."""
        caller = self._caller if self.is_current() else None
        return caller if caller is not None else threading.current_thread()

    def forget(self) -> None:
        """In a child process after ``fork``: the thread did not come along; the next call starts one."""
        self._mutex, self._calls = threading.Lock(), queue.SimpleQueue()
        self._thread = self._caller = None


MODEL_THREAD = ModelThread()
os.register_at_fork(after_in_child=MODEL_THREAD.forget)


def on_model_thread(function: Callable[[], T]) -> T:
    """``function()`` run on the process's model thread (see the module docstring)."""
    return MODEL_THREAD.run(function)


def is_model_thread() -> bool:
    """Whether the calling thread is the model thread (a call there runs at once)."""
    return MODEL_THREAD.is_current()


def calling_thread() -> threading.Thread:
    """The thread a model works for: on the model thread, the one that handed it the call now
    running; elsewhere, the current thread (a model that tells its callers apart, as the tests'
    embedders do, asks this rather than ``threading.current_thread()``)."""
    return MODEL_THREAD.calling_thread()
