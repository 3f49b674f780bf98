"""Debounced starts: a burst of ``run_async`` calls with one key becomes one run.

``with_debounce(key, seconds)`` on a reactor, or ``run_async(..., debounce=(key, seconds))``
for one call, makes a start part of a burst (docs/coordination.md, "Debounce"). A start is an
ordinary pending execution sent with a countdown; what debounce adds happens at the call:

1. Before anything is stored, Redis places the start in its burst (``coordination.debounce``,
   on the Redis clock): it answers which earlier start this one replaces and when this one is
   due — a quiet period after it, capped at the burst's first start plus ``max_wait``. An
   unreachable Redis raises ``CoordinationUnavailable`` at the call: nothing is stored.
2. The row is created with its heartbeat at the due time (so the sweeper, which re-sends
   pending rows whose message was lost, cannot send it early) and its message carries the
   countdown.
3. Once the row is committed, the replaced start is marked ``superseded`` by this one (a
   compare-and-set on ``pending``: a start a worker already took simply runs), and this one
   by a later start that replaced it meanwhile (``settle``: concurrent starts commit in any
   order). A superseded start's message still arrives at its due time and finds nothing to do.
   The mark also takes the claim of a delivery that holds the row (``supersede``): a delivery
   that decided to run the start finds its claim gone when it writes the start, and does not
   run it. The settles of one burst take turns (an advisory lock on the burst's key), so they
   never deadlock on each other's rows (docs/coordination.md, "Debounce").

4. When a start's message is delivered, the worker asks Redis again (``at_delivery``): a start
   that is no longer its burst's latest does not run — it is marked superseded by the latest
   then, whether or not the settle of step 3 got to it first. Step 3 alone races the countdown:
   on a loaded machine the later starts' commits can come after the first start is due.

A caller whose transaction rolls back leaves its start in Redis as the burst's latest: the start
it replaced is not marked (that happens on commit), and at delivery it waits for the latest's
row (``WAIT_FOR_LATEST`` at a time) until Redis lets the burst go; then it runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from reactor_app import bounds
from reactor_app.coordination import debounce
from reactor_app.coordination.keys import user_key_problem
from reactor_app.exceptions import InputValidationError
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

if TYPE_CHECKING:
    from reactor_app.dsl.reactor import Reactor

logger = logging.getLogger(__name__)

#: seconds a delivered start waits before it looks again for the row of the start that
#: replaced it, when that row is not committed yet (``at_delivery``)
WAIT_FOR_LATEST = 0.2


@dataclass(frozen=True)
class Burst:
    """The burst a start belongs to: its key, quiet period and cap (seconds)."""

    key: str
    seconds: float
    max_wait: float | None = None


def burst_of(
    reactor: type[Reactor], inputs: dict[str, Any], option: tuple[str, float] | None
) -> Burst | None:
    """The burst of this start: ``run_async``'s ``debounce=(key, seconds)``, else the
    reactor's ``with_debounce`` applied to the inputs, else None."""
    if option is not None:
        return _from_option(reactor, option)
    declaration = reactor.debounce_config
    if declaration is None:
        return None
    key = declaration.compute_key(inputs, reactor=reactor.path(), step=None)
    return Burst(key, declaration.seconds, declaration.max_wait)


def _from_option(reactor: type[Reactor], option: Any) -> Burst:
    key, seconds = option if isinstance(option, tuple) and len(option) == 2 else (None, 0)
    if isinstance(key, str) and (problem := user_key_problem(key)) is not None:
        raise InputValidationError(
            f"debounce key {key[:80]!r} {problem}",
            reactor=reactor.path(),
            step=None,
            field_errors={"debounce": f"the key {problem}"},
        )
    if isinstance(key, str) and key.strip() and _within(seconds):
        return Burst(key, float(seconds))
    raise InputValidationError(
        f"debounce must be (key, seconds) with a non-empty key and seconds from "
        f"{bounds.SHORTEST_SECONDS} to {bounds.LONGEST_TEXT}, got {option!r}",
        reactor=reactor.path(),
        step=None,
        field_errors={"debounce": "expected (key, seconds)"},
    )


def _within(seconds: object) -> bool:
    """A quiet period the debounce script can keep (``reactor_app.bounds``)."""
    try:
        bounds.seconds_within(seconds, "seconds")
    except ValueError:
        return False
    return True


def place(burst: Burst, execution_id: str) -> debounce.DebouncedStart:
    """Step 1: this start's place in its burst (see the module docstring)."""
    return debounce.start(burst.key, execution_id, quiet=burst.seconds, max_wait=burst.max_wait)


def settle_on_commit(burst: Burst, earlier: list[str], execution_id: str) -> None:
    """Step 3: once this start is committed, settle who runs (``settle``)."""
    transaction.on_commit(lambda: settle(burst, earlier, execution_id))


def settle(burst: Burst, earlier: list[str], execution_id: str) -> None:
    """Mark the burst's earlier starts superseded by this one — and this one superseded by the
    burst's latest start if a later one came meanwhile.

    Starts of one burst commit in any order, so an earlier start's row may not be there yet
    when this one commits; that is why each start also looks, once committed, for a later start
    that replaced it. For any two starts of a burst, whichever commits second marks the other.
    A later start that is not committed yet cannot be named (the foreign key refuses a row that
    is not there); it marks this one itself when it commits. Never raises (an on-commit hook):
    what fails is logged, and a start left unmarked simply runs.

    Only a later start *of this one's burst* replaces it (``coordination.debounce.replacement``,
    as ``at_delivery`` asks it). A settle that comes late (its process stalled between the commit
    and this hook) may find that burst over and a new one begun on the key: this start was its
    own burst's last and runs; the new burst's latest is not its replacement. (Asking Redis
    for the key's latest start alone marked it superseded by the next burst's, and neither
    burst ran it: found by the generated schedules of ``tests/integration``.)
    """
    now = timezone.now()
    try:
        if earlier:
            Execution.objects.supersede(earlier, execution_id, now, burst=burst.key)
        newest = debounce.replacement(burst.key, execution_id)
    except Exception:
        logger.exception("could not settle debounced start %s", execution_id)
        return
    if newest is None:
        return
    try:
        Execution.objects.supersede([execution_id], newest, now, burst=burst.key)
    except IntegrityError:
        pass  # the later start is not committed yet: its own settle marks this one
    except Exception:
        logger.exception("could not mark %s superseded by %s", execution_id, newest)


def at_delivery(execution: Execution, burst_key: str) -> str | None:
    """What a worker does with a pending start of a burst when its message arrives (step 4):
    ``None`` to run it; ``"superseded"`` when a later start replaced it (marked now); or
    ``"wait"`` when the start that replaced it is not committed yet (look again in
    ``WAIT_FOR_LATEST``); ``"ended"`` when the row stopped being pending meanwhile. A start
    that is not in the burst Redis keeps (the burst ended and
    another began, or Redis let it go) is its burst's last: it runs."""
    me = str(execution.pk)
    newest = debounce.replacement(burst_key, me)
    if newest is None:
        return None
    try:
        if not Execution.objects.filter(pk=newest).exists():
            return "wait"
        Execution.objects.supersede([execution.pk], newest, timezone.now(), burst=burst_key)
    except DatabaseError:
        # the latest's row went missing meanwhile (IntegrityError), or the database gave up
        # on a contended settle: look again shortly rather than fail the delivery (a failed
        # delivery would leave the start pending until the sweeper)
        logger.warning("debounced start %s: could not settle at delivery", me, exc_info=True)
        return "wait"
    # marked now, or by the settle of a later start meanwhile: either way it does not run;
    # a row no longer pending for another reason (ended meanwhile) does not run either
    status = Execution.objects.filter(pk=execution.pk).values_list("status", flat=True).first()
    if status == ExecutionStatus.SUPERSEDED:
        return "superseded"
    return None if status == ExecutionStatus.PENDING else "ended"
