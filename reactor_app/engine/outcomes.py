"""How a unit of work and a pass of the main loop end: the engine's outcome vocabularies.

* ``UnitStatus``: what the executor learns from one step (``runner.StepOutcome``), whatever
  its kind — a plain step, a composed child, a map, an interrupt, a dispatched async child.
* ``PassEnd``: how one pass of ``ExecutionRun`` ended (``RunEnd``); besides the terminal
  statuses a pass can end parked, interrupted or handed off to a worker.
* ``ReleaseOutcome`` (``coordination.claims.Outcome``, re-exported): what a release tells
  the coordination layer — it decides a period mark and an ordered-lock cursor.

The values are the strings the engine always used (they appear in task results and on
``Result.status``), so a ``StrEnum`` member compares equal to its old string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from reactor_app.coordination.claims import Outcome as ReleaseOutcome

if TYPE_CHECKING:
    from reactor_app.engine.gate import ParkRequested
    from reactor_app.exceptions import ReactorError

__all__ = ["PassEnd", "ReleaseOutcome", "RunEnd", "UnitStatus", "release_outcome"]


class UnitStatus(StrEnum):
    """How one step ended, as the executor sees it."""

    COMPLETED = "completed"  # a result: stored, and in the rollback log
    SKIPPED = "skipped"  # a value that flows on, never undone
    FAILED = "failed"
    HALTED = "halted"  # a clean stop: no rollback
    PARKED = "parked"  # contention on a worker (or a retry/outage requeue): nothing ran
    INTERRUPTED = "interrupted"  # paused at an interrupt step
    DISPATCHED = "dispatched"  # an async child was created: no result yet


class PassEnd(StrEnum):
    """How one pass of the main loop ended."""

    SUCCEEDED = "succeeded"
    HALTED = "halted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARKED = "parked"
    INTERRUPTED = "interrupted"
    HANDED_OFF = "handed_off"  # in process, ``background = "after:<step>"``: a worker goes on


@dataclass
class RunEnd:
    """How one pass of the main loop ended."""

    status: PassEnd
    value: Any = None
    error: ReactorError | None = None
    reason: str | None = None
    park: ParkRequested | None = None
    rollback_failures: list[dict[str, Any]] = field(default_factory=list)


#: what the reactor-level holds are released with at the end of a pass
_RELEASE_AFTER: dict[PassEnd, ReleaseOutcome] = {
    PassEnd.SUCCEEDED: "success",
    PassEnd.FAILED: "failure",
    PassEnd.HALTED: "halt",
    # the execution is not over: give the holds back, keep the ordered position (a parked
    # pass suspends its reactor gate instead, keeping its locks and semaphores: ``execute``)
    PassEnd.PARKED: "park",
    PassEnd.INTERRUPTED: "park",
    PassEnd.HANDED_OFF: "park",
    # ends the run without failing a strict ordered line or marking a period bucket
    PassEnd.CANCELLED: "halt",
}


def release_outcome(end: RunEnd | None) -> ReleaseOutcome:
    """The release outcome of a pass's reactor-level holds (None: it ended by an exception)."""
    if end is None:
        return "failure"
    return _RELEASE_AFTER.get(end.status, "failure")
