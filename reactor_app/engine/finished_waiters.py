"""Finished executions in a lock's or semaphore's waiter line: passed over by the release that
frees the key (or the slot).

A worker execution's entry in a key's waiter line can outlive it: an execution cancelled or
failed while parked, a delivery killed after it registered. A lock's release grants the free
key to the head of the line for ``HANDOFF_GRANT_MS`` (3 s, ``lua/_common.lua``) and names it to
be re-enqueued; granted to an execution that has finished, the key sits idle that long, since
nobody comes to take it — in a run where worker children are killed, release after release.
``past_finished`` is what the releasing gate does about it, once it has re-enqueued the woken
waiters (first: the look-up is a database query, and the next holder's delivery need not wait
for it): the woken parked waiters' executions are looked up in one query, and a finished one
leaves the line at once (``lua/lock_leave.lua``), which hands the grant on to the next waiter
— checked the same way — whom the gate re-enqueues in turn. The finished one's own wake
message finds its execution finished and does nothing. A semaphore's release hands a freed
slot on the same way (``lua/_semaphore.lua``, ``lua/semaphore_leave.lua``), so its line is
passed over likewise. The line itself stays in Redis, where the store of execution statuses
is not: the look-up is the engine's.
"""

from __future__ import annotations

import logging

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import WAITING_PREFIX, Admitted, LockClaim, SemaphoreClaim
from reactor_app.models import Execution
from reactor_app.status import TERMINAL_STATUSES

logger = logging.getLogger(__name__)

#: how many finished waiters in a row one release passes over before it stops looking (the
#: rest are passed over by later releases, or lapse with their grants)
FINISHED_WAITERS_PASSED = 20


def past_finished(coordinator: Coordinator, admitted: Admitted, woken: list[str]) -> list[str]:
    """The waiters a release woke, with the freed locks handed on past waiters whose execution
    has already finished: their line entry outlived them (an execution cancelled or failed
    while parked, a delivery killed after registering). A lock's release grants the free key
    to the head waiter for ``HANDOFF_GRANT_MS`` (3 s); granted to a finished execution, the
    key would sit idle that long, since nobody comes to take it. So each woken parked waiter's
    execution is looked up, and a finished one leaves the line at once
    (``lua/lock_leave.lua``): its grant goes on to the next waiter, which is checked the same
    way. Best effort: when the lookup fails, the waiters are woken as they are (the grant
    lapses as before).
    """
    locks = [
        hold.claim for hold in admitted.holds if isinstance(hold.claim, (LockClaim, SemaphoreClaim))
    ]
    parked = [w for w in woken if not w.startswith(WAITING_PREFIX)]
    if not locks or not parked:
        return woken
    kept = [w for w in woken if w not in parked]
    try:
        for _ in range(FINISHED_WAITERS_PASSED):
            statuses = Execution.objects.statuses_of(parked)
            finished = [w for w in parked if statuses.get(w) in TERMINAL_STATUSES]
            kept += [w for w in parked if w not in finished]
            if not finished:
                return kept
            handed_on: list[str] = []
            for waiter in finished:
                for claim in locks:
                    handed_on += coordinator.unregister_waiter(claim, waiter)
            kept += [w for w in handed_on if w.startswith(WAITING_PREFIX)]
            parked = [w for w in handed_on if not w.startswith(WAITING_PREFIX)]
            if not parked:
                return kept
    except Exception:
        logger.warning("could not pass finished waiters over; woken as they are", exc_info=True)
        return woken
    return kept + parked
