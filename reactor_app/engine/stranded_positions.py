"""Ordered-line heads whose execution has ended, or whose unit lost them: completed by the
sweep.

An ordered position is completed by its holder's release. A release Redis acknowledged and
then lost — a Sentinel or cluster failover promotes a replica that never received it — leaves
the position registered, and in flight, on the new master while its execution has ended.
Nothing would ever complete it: the line behind it waited for the poison-pill timeout (ten
minutes by default) before the next arrival passed it over.

The sweep (``engine.sweeper``) now looks at the lines parked executions wait in
(``ContentionState`` rows of the ordered lock). A head is completed on its holder's behalf
when all of these hold:

* its registration names an execution (a ``Step.call`` head names none: left to the pill),
  and that execution has ended (a terminal status) or is gone — or records a later place of
  this line for the same unit (step, map element, or the reactor): a place the line gave and
  the execution never recorded, its delivery having ended between the two (killed, or cut by
  a time limit), so that the unit took a new place when it came back and waited behind its
  own lost one;
* the position has shown no sign of life for ``REACTOR_SWEEP_AFTER`` — the bound after which
  the sweep treats a delivery as vanished, and far longer than a running head's heartbeat
  interval — so a head whose delivery still runs (a duplicate that lost its claim) is left
  alone.

It is completed with the outcome ``halt`` (passed over, not failed: a strict line goes on), by
the same release a cancelled idle execution uses for its positions (``engine.leftovers``),
naming the exact position (nonce and epoch): a head that moved on meanwhile is not touched
twice. The waiters it lets through are woken, and an ``ordered_skipped`` event records it
(``by: "sweep"``). docs/operations.md ("Sentinel: failover and what it can lose") gives the
bound this makes.
"""

from __future__ import annotations

import logging
import uuid

from redis.exceptions import RedisError

from reactor_app.conf import reactor_settings
from reactor_app.coordination import ordered_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Hold,
    Holder,
    OrderedLockClaim,
    OrderedPosition,
)
from reactor_app.engine.enqueueing import wake
from reactor_app.engine.state import REACTOR_SLOT
from reactor_app.exceptions import ReactorError
from reactor_app.models import ContentionState, Execution
from reactor_app.status import TERMINAL_STATUSES, CoordinationEventKind
from reactor_app.tracking import record_coordination

logger = logging.getLogger(__name__)


def complete_stranded_heads() -> list[str]:
    """Complete the heads of ordered lines with parked waiters whose execution has ended and
    whose position is silent (module docstring); wake the waiters that lets through. Returns
    ``"<key>#<nonce>"`` for each head completed."""
    keys = (
        ContentionState.objects.filter(primitive=ordered_lock.PRIMITIVE)
        .values_list("key", flat=True)
        .distinct()
    )
    coordinator = Coordinator()
    completed: list[str] = []
    for key in keys:
        try:
            nonce = _complete_if_stranded(coordinator, key)
        except (ReactorError, RedisError):
            logger.warning("could not check the head of ordered lock %r", key, exc_info=True)
            continue
        if nonce is not None:
            completed.append(f"{key}#{nonce}")
    return completed


def _complete_if_stranded(coordinator: Coordinator, key: str) -> int | None:
    line = ordered_lock.ordered_state(key, client=coordinator.client, prefix=coordinator.prefix)
    if line.head is None or line.epoch is None:
        return None
    head = next((p for p in line.positions if p.nonce == line.head), None)
    # an unregistered head is passed over by the next admission already
    if head is None or not head.execution:
        return None
    if head.heartbeat_age < reactor_settings.SWEEP_AFTER:
        return None
    ended, exists = _ended(head.execution)
    lost = not ended and _lost_by_its_unit(head, key, line.epoch)
    if not (ended or lost):
        return None
    # the line's own lifetime, kept as it is (the release refreshes it with the claim's ttl)
    left_ms = coordinator.client.pttl(ordered_lock.state_key(key, coordinator.prefix))
    claim = OrderedLockClaim(
        key=key,
        position=OrderedPosition(nonce=head.nonce, epoch=line.epoch),
        ttl=max(left_ms, 1000) / 1000 if left_ms and left_ms > 0 else OrderedLockClaim.ttl,
    )
    holder = Holder(
        owner=head.owner or "",
        execution_id=head.execution,
        step=head.step,
        reactor=head.reactor,
    )
    released = coordinator.release(
        Admitted(holds=[Hold(claim=claim, fresh=True)], holder=holder), "halt"
    )
    if released.woken:
        wake(list(released.woken))
    record_coordination(
        CoordinationEventKind.ORDERED_SKIPPED,
        primitive=ordered_lock.PRIMITIVE,
        key=key,
        owner=head.owner or "",
        step=head.step,
        reactor=head.reactor,
        execution_id=head.execution if exists else None,
        by="sweep",
        nonce=head.nonce,
        reason=(
            "its unit had recorded a later place and this one was silent"
            if lost
            else "its execution had ended and its position was silent"
        ),
        woken=list(released.woken),
    )
    logger.warning(
        "sweep completed position %s of ordered lock %r: %s",
        head.nonce,
        key,
        f"a place lost by {head.execution}" if lost else f"its execution {head.execution} ended",
    )
    return head.nonce


def _lost_by_its_unit(head: ordered_lock.Position, key: str, epoch: int) -> bool:
    """Whether the head is a place its unit was given and lost: the unit's execution records a
    later place of the same line for the same unit (step, map element, or the reactor). Its
    delivery ended between the script's answer and the record, and the unit took a new place
    when it came back — it will never use this one, and without this the unit waited behind
    its own lost place until ``poison_pill_timeout``."""
    try:
        pk = uuid.UUID(str(head.execution))
    except ValueError:
        return False
    context = Execution.objects.filter(pk=pk).values_list("context", flat=True).first()
    if not isinstance(context, dict):
        return False
    recorded = (context.get("ordered") or {}).get(head.step or REACTOR_SLOT)
    if not isinstance(recorded, dict) or recorded.get("key") != key:
        return False
    return int(recorded.get("epoch", -1)) == epoch and int(recorded.get("nonce", 0)) > head.nonce


def _ended(execution_id: str) -> tuple[bool, bool]:
    """Whether ``execution_id`` names an execution that has ended (or no longer exists), and
    whether its row exists."""
    try:
        pk = uuid.UUID(str(execution_id))
    except ValueError:
        return False, False  # not an execution of ours: left to the poison pill
    status = Execution.objects.filter(pk=pk).values_list("status", flat=True).first()
    return status is None or status in TERMINAL_STATUSES, status is not None
