"""Deliveries lost in a row: a unit that kills every delivery running it fails, after a few.

WHY: a worker delivery that dies — its pool process killed by the kernel's out-of-memory
killer, a crash in native code, Celery's hard time limit — is sent again (``acks_late`` +
``reject_on_worker_lost``, else the sweep), and the delivery that takes over goes on from the
last checkpoint (``engine.delivery``). That is right for a deploy or a one-off kill. But a body
that kills its process *every* time it runs was sent again without end: each turn another
killed pool process, its holds re-taken, the execution never finished and never rolled back —
the saga promise's "undone once" never came (docs/operations.md, "Lost deliveries").

So a delivery that takes over (it found the execution still ``running``: the one before it
did not end) counts the loss, durably, before it runs anything, together with the point the
work had reached (``position``). Losses count in a row while that point stays the same; any
progress — a unit completed, an attempt spent, a rollback hook done — starts the count again.
Once ``REACTOR_LOST_DELIVERY_LIMIT`` losses are counted at one point, the unit there is not
run again: the next unit a delivery starts at that point (a step body, a map element, an undo
or a compensate) fails at once with ``DeliveryLost``, not retried, as if it had raised it — a
step is compensated and the run rolled back; an undo or a compensate is reported not done
(``UndoFailed`` / ``CompensationFailed``) and the rollback goes on. The verdict is the
execution's, kept with the count: a delivery that parks before reaching the unit (its
admission refused) leaves it to the next delivery at that point. Giving it is written down
first (``given``). A step's own compensate runs before its failure is recorded, so one that
kills its delivery comes back to the same point with the verdict already given there: given
again, it fails the body and passes over that compensate too.

The point is a fingerprint of what the progress writes change (``engine.progress``): the
number of progress rows, the next step, the rollback's hooks done, the attempts spent and the
failures waiting for a retry — of the execution and of the composed children in progress under
it (their units run in its deliveries). A park, a requeue or a kept hold's renewal changes
none of them: a unit that parks between two losses is still where it was.

A sequential map writes its elements in batches (``REACTOR_MAP_CHECKPOINT_EVERY``); after a
loss it writes each element (``ExecutionRun.element_done``), so that the point names the
element that kills the delivery, not the first of an unwritten batch.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from reactor_app.conf import reactor_settings
from reactor_app.engine.state import ROWS, LostDeliveries, is_lost_mark
from reactor_app.exceptions import DeliveryLost
from reactor_app.models import Execution

if TYPE_CHECKING:
    from reactor_app.engine.executor import ExecutionRun


def position(contexts: list[dict[str, Any]]) -> str:
    """A fingerprint of the point the work of these stored contexts (an execution's, then its
    composed children's) has reached; equal while no unit of theirs made progress."""
    marks = []
    for context in contexts:
        rolling = context.get("rolling_back") or {}
        marks.append(
            [
                context.get(ROWS, 0),
                # rows of an older version keep their growing parts in the context
                len(context.get("results") or {}),
                len(context.get("completed") or []),
                context.get("next_index", 0),
                sorted((context.get("attempts") or {}).items()),
                # a lost delivery's marks are not progress (``engine.in_flight``)
                sorted(
                    label
                    for label, entry in (context.get("pending_failures") or {}).items()
                    if not is_lost_mark(entry)
                ),
                [rolling.get("status"), rolling.get("done")] if rolling else None,
            ]
        )
    text = json.dumps(marks, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def counted(previous: LostDeliveries | None, at: str) -> LostDeliveries:
    """The count after one more loss at ``at``: one more in a row at the same point (a verdict
    given there stays on record), else the first at a new one."""
    if previous is not None and previous.get("at") == at:
        entry = LostDeliveries(count=int(previous.get("count", 0)) + 1, at=at)
        if "given" in previous:
            entry["given"] = previous["given"]
        return entry
    return LostDeliveries(count=1, at=at)


def fails_next_unit(count: int, limit: int) -> bool:
    """Whether a delivery that counted ``count`` losses in a row fails the unit it reaches."""
    return limit > 0 and count >= limit


def note_lost(run: ExecutionRun) -> None:
    """Count the loss of the delivery ``run``'s delivery takes over from, durably, before any
    unit runs (in the same write as the units the lost delivery may have been running,
    ``engine.in_flight``, which the caller marked)."""
    entry = counted(run.state.continuation.lost_deliveries, position(_contexts(run)))
    run.state.continuation.lost_deliveries = entry
    run.persist()


def arm_verdict(run: ExecutionRun, *, taken_over: bool) -> None:
    """Give this delivery the verdict when its execution's count reached the limit at the point
    it starts from and none was given since the last loss; ``take_verdict`` hands it to the
    first unit it starts. A delivery that took over has just counted at this very point."""
    entry = run.state.continuation.lost_deliveries
    if entry is None or entry.get("given", 0) >= entry["count"]:
        return
    if not fails_next_unit(entry["count"], reactor_settings.LOST_DELIVERY_LIMIT):
        return
    if taken_over or position(_contexts(run)) == entry["at"]:
        run.lost_verdict = entry


def take_verdict(run: ExecutionRun | None, label: str) -> DeliveryLost | None:
    """The error the unit ``label`` fails with instead of running, once per verdict (written
    down as given before the unit goes on); None to run it."""
    entry = run.root.lost_verdict if run is not None else None
    if run is None or entry is None:
        return None
    root = run.root
    root.lost_verdict = None
    again = "given" in entry
    root.state.continuation.lost_deliveries = LostDeliveries(
        count=entry["count"], at=entry["at"], given=entry["count"]
    )
    root.persist()  # a loss in what follows finds the verdict given here
    limit = reactor_settings.LOST_DELIVERY_LIMIT
    error = DeliveryLost(
        f"{label!r} of {run.reactor_path} was not run again: {entry['count']} deliveries of "
        f"execution {root.execution_id} were lost in a row at this point of its work (each "
        "one's process ended before it got further: killed, out of memory, a crash, a hard "
        f"time limit; REACTOR_LOST_DELIVERY_LIMIT = {limit})",
        reactor=run.reactor_path,
        step=label,
        lost=entry["count"],
        limit=limit,
    )
    error.again = again
    return error


def skips_compensate(error: BaseException) -> bool:
    """A step failed by a verdict given again at one point: the compensate that ran after the
    first one (a step's compensate runs before its failure is recorded) is what kills the
    deliveries there, so it is not run again."""
    return isinstance(error, DeliveryLost) and error.again


def _contexts(run: ExecutionRun) -> list[dict[str, Any]]:
    """The stored contexts of ``run``'s execution and of the composed children it runs."""
    context = run.execution.context or {}
    return [context, *_composed_contexts(context)]


def _composed_contexts(context: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored contexts of the composed children in progress under ``context``, at every
    depth (their units run in the parent's deliveries)."""
    found: list[dict[str, Any]] = []
    ids = sorted((context.get("children") or {}).values())
    while ids:
        rows = dict(Execution.objects.filter(pk__in=ids).values_list("pk", "context"))
        ids = []
        for pk in sorted(rows, key=str):
            child = rows[pk] or {}
            found.append(child)
            ids.extend(sorted((child.get("children") or {}).values()))
    return found
