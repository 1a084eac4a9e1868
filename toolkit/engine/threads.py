"""Sync handlers run in reused daemon threads: a handler that never returns cannot hang exit.

The event loop's own thread pool joins its threads at exit, so one stuck handler would hang
a worker's shutdown; a fresh thread per call would cost a thread start on every sync step.
:class:`DaemonThreads` keeps idle daemon threads for :data:`IDLE_SECONDS` and hands each call
to one of them; a call abandoned by its awaiting task (its step's timeout, a shutdown) keeps
its thread until it returns, and its result is dropped.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

T = TypeVar("T")

#: Seconds an idle thread waits for another call before it ends.
IDLE_SECONDS = 10.0

Job = Callable[[], None]


class DaemonThreads:
    """A pool of daemon threads that grows with the calls in flight and shrinks when idle.

    Each thread takes jobs from one queue; a job is given to the queue only when a thread is
    known to be idle (``_idle`` counts them), otherwise a new thread is started for it.
    """

    def __init__(self, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self._name = name
        self._idle_seconds = idle_seconds
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    @property
    def started(self) -> int:
        """Threads started so far (for tests and diagnostics)."""
        return self._started

    def submit(self, job: Job) -> None:
        """Run ``job()`` in an idle thread of the pool, or in a new one when none is idle."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # claimed: the next idle thread to wake takes this job
                self._jobs.put(job)
                return
            self._started += 1
            number = self._started
        threading.Thread(
            target=self._serve, args=(job,), name=f"{self._name} {number}", daemon=True
        ).start()

    def _serve(self, job: Job) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody claimed this thread: it ends
                        self._idle -= 1
                        return
                # a job was claimed for an idle thread just as this one timed out: take it
                job = self._jobs.get()


#: The pool every sync handler call runs in.
HANDLER_THREADS = DaemonThreads("toolkit handler")


async def in_thread(func: Callable[[], T]) -> T:
    """Run a sync handler in a daemon thread; a cancelled call abandons the thread.

    Args:
        func: the call, with its arguments bound.

    Returns:
        What ``func`` returned.

    Raises:
        Whatever ``func`` raised.
    """
    token = anyio.lowlevel.current_token()
    finished = anyio.Event()
    outcome: list[tuple[bool, Any]] = []

    context = contextvars.copy_context()  # the caller's: its trace span, the app's own

    def job() -> None:
        try:
            outcome.append((True, context.run(func)))
        except BaseException as exc:  # handed to the awaiting task, or dropped
            outcome.append((False, exc))
        try:
            anyio.from_thread.run_sync(finished.set, token=token)
        except RuntimeError:
            pass  # the event loop is gone: nobody awaits this call any more

    HANDLER_THREADS.submit(job)
    await finished.wait()
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
