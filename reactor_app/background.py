"""A process's background thread, started on first need and started again whenever it is not
running.

Three of the process's helpers do their work on one daemon thread each, started lazily by
the first caller that needs it: the hold renewer (``coordination.renewal``), the execution
claim renewer (``engine.claim``) and the tracking writer (``write_behind``). That first caller
is often inside a worker delivery, where Celery's soft time limit can raise
``SoftTimeLimitExceeded`` at any line (a signal handler runs wherever the interpreter checks
for one). Each used to remember its thread before starting it, and to start one only while it
remembered none: a soft limit landing between the two left a thread remembered and never
started, so that process renewed no hold again (a lock held past its lease would lapse under
its holder), or wrote no tracking row again. A thread that died of an unexpected exception
was never replaced either.

``BackgroundThread.ensure`` asks instead whether the thread it remembers is alive, and starts
a new one when it is not. Wherever the limit lands, the next caller's ``ensure`` starts it.
docs/operations.md, "Background threads", says the same for users.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """One daemon thread running ``target``, (re)started by ``ensure``.

    Not locked itself: its owner calls ``ensure`` under the owner's lock, so two callers never
    both start one."""

    __slots__ = ("_name", "_target", "_thread")

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target = target
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        """The thread last started (it may have ended), or None."""
        return self._thread

    def running(self) -> bool:
        """Whether the thread was started and has not ended. Cheap enough for every call of
        a hot path: one flag, one event and a lock taken without waiting."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def ensure(self) -> bool:
        """Start a thread unless one runs; whether this call started one. The owner holds its
        lock. A thread is remembered before it is started and asked ``is_alive`` after: one
        created but never started (the caller cut off in between) is replaced by the next
        call, never taken for a running one."""
        if self.running():
            return False
        thread = threading.Thread(target=self._target, name=self._name, daemon=True)
        self._thread = thread
        thread.start()
        return True

    def is_current(self) -> bool:
        """Whether the calling thread is this one (its own callbacks must not wait for it)."""
        return threading.current_thread() is self._thread
