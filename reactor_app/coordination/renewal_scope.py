"""Renewals that end with a block of work: stopped when the block ends, however it ends.

WHY: the gates of a worker delivery stop the renewals they started when they exit, in
``finally`` blocks. Celery's soft time limit is an exception raised by a signal handler, and
the interpreter runs a handler at a function's entry among other places — so it can land at
the very start of such an exit, before the exit stopped anything. The renewal then went on
renewing holds nothing worked under any more, until the next delivery gave them back and it
logged them lost (docs/operations.md, "Celery time limits"). So a delivery runs its pass
inside ``renewals_scope()``: every renewal started in the block (by this thread or task: a
``ContextVar``) and still renewing when the block ends is stopped then. A second line behind
the gates' own, which one soft limit cannot cut both of; the holds themselves stay in Redis,
as a killed delivery leaves them, for the next delivery to take over or give back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class Stoppable(Protocol):
    stopped: bool

    def stop(self, timeout: float = 5.0) -> None: ...


#: the renewals started inside the innermost scope of this context; None outside any
_started: ContextVar[list[Stoppable] | None] = ContextVar("reactor_renewals_started", default=None)


def note_started(renewal: Stoppable) -> None:
    """A renewal starts (before it is scheduled): the scope it starts in ends it at the latest."""
    started = _started.get()
    if started is not None:
        started.append(renewal)


@contextmanager
def renewals_scope() -> Iterator[None]:
    """Run the block; then stop every renewal it started that still renews.

    The list is set inside the ``try``: a soft limit landing right after the set (a
    signal's handler runs once a call has returned) used to leave this scope's list in the
    context for good, and renewals started later outside any scope were appended to it. The
    outer value is put back by the ``finally``'s first call, so a limit landing inside the
    ``finally`` comes after it, for the same reason."""
    started: list[Stoppable] = []
    outer = _started.get()
    try:
        _started.set(started)
        yield
    finally:
        _started.set(outer)
        for renewal in started:
            if not renewal.stopped:
                renewal.stop()
