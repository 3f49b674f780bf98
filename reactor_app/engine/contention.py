"""What a unit does when its lock or semaphore is taken: ``on_contention`` (docs/coordination.md,
"Contention strategies").

``"queue"`` (the default) waits in-process or parks on a worker, as every admission always did.
The other strategies decide at the first refusal, before any waiting:

* ``"skip"`` — the unit does not run: a step ends ``skipped`` (reason ``contended``; nothing to
  undo), a reactor-level gate halts the run with that reason;
* ``"cancel_newest"`` — the newcomer is cancelled at once: its execution's cancel flag is raised
  (reason and ``by="on_contention"``), so the run ends ``cancelled`` with its completed steps
  undone, as an operator's cancel would; a direct ``Step.call`` just fails;
* ``"cancel_in_progress"`` (locks) — the newcomer asks for the cancel of the execution holding
  the key (``engine.cancel``: the holder stops at its next boundary and rolls back, which
  releases the key), then queues for the key as ``"queue"`` does.

Each decision is a coordination event on the refused key (``acquisition_failed`` with detail
``on_contention``), and a cancel is also the cancelled execution's own ``cancelled`` event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from reactor_app.engine.cancel_flag import request_cancel
from reactor_app.exceptions import ReactorError

if TYPE_CHECKING:
    from reactor_app.coordination.claims import Refused
    from reactor_app.engine.gate import GateScope

logger = logging.getLogger(__name__)

QUEUE, SKIP, CANCEL_NEWEST, CANCEL_IN_PROGRESS = (
    "queue",
    "skip",
    "cancel_newest",
    "cancel_in_progress",
)
#: strategies decided at the first refusal, without waiting or parking first
DECIDED_AT_ONCE = (SKIP, CANCEL_NEWEST, CANCEL_IN_PROGRESS)
#: who a strategy's cancel is recorded as having been asked by
BY = "on_contention"


def cancel_newcomer(scope: GateScope, refused: Refused) -> None:
    """``cancel_newest``: raise this execution's own cancel flag (the executor then ends it
    cancelled, rolling its completed steps back). A direct call has no execution to cancel."""
    target = scope.owner if scope.execution_id else None
    if target is None:
        return
    request_cancel(
        target,
        f"{refused.claim.primitive} {refused.claim.key!r} was taken "
        "(on_contention='cancel_newest')",
        BY,
    )


def cancel_holder(scope: GateScope, refused: Refused) -> str | None:
    """``cancel_in_progress``: ask for the cancel of the execution holding the key; returns
    its id, or None when the holder is not an execution that can be cancelled (a direct call,
    one that already ended)."""
    holder = (refused.blocker or {}).get("execution")
    if not holder or holder == scope.execution_id:
        return None
    # deferred: cancelling reaches the executor (a rollback of an idle execution), which imports
    # the gate this module serves
    from reactor_app.engine.cancel import cancel_execution

    reason = (
        f"replaced by {scope.execution_id or 'a direct call'} "
        f"(on_contention='cancel_in_progress' on {refused.claim.primitive} {refused.claim.key!r})"
    )
    try:
        cancel_execution(holder, reason, by=BY)
    except Exception as exc:  # ended meanwhile, unknown, Redis down: the newcomer just queues
        level = logging.INFO if isinstance(exc, ReactorError) else logging.WARNING
        logger.log(level, "could not cancel %s holding %s: %s", holder, refused.claim.key, exc)
        return None
    return str(holder)
