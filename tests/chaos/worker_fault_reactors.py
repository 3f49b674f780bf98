"""Small reactors recording their holds, one per primitive and level (step-level and
reactor-level lock, semaphore, rate limit, period and ordered lock), for the fault schedules
on real workers (tests/chaos/test_worker_fault_histories.py: holders SIGKILLed;
tests/chaos/test_worker_restart_histories.py: the coordination Redis restarted empty; and
the lost-reply and Sentinel-failover schedules beside them), in a module of its own so that
Celery worker processes import them by their registered path.

Every coordinated body records into the schedule's history file (``reactor_app.testing.
history``: one ``O_APPEND`` write per event, so the worker processes and the test share it):
that it entered, with what its admission gave it (fencing token, ordered position, period
bucket), then — as its last act — the release it is about to make, left open (the release
happens after the body and nobody is told whether it freed the hold; a rate limit gives
nothing back). While it holds its key it names its process in Redis, so the schedule can kill
the holder.

When was each admission? After the start of the delivery that ran the body — the latest task
the body's process started (``task_prerun``, appended to the file the setting
``FAULT_DELIVERIES_FILE`` names, not to Redis: the restart schedule empties the coordination
Redis; a pool process runs one task at a time); after ``Reached``, the step before each
step-level primitive; after the enqueue (the test records it). The test places an admission
from the latest of those to the body's start. A reactor-level admission is made in the delivery
that runs its body: these reactors have one step and nothing to park on after the reactor's
gate. The worker imports this module at its start (``CELERY_IMPORTS`` of the test's settings),
so the signal is connected in every pool process before its first task.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from celery.signals import task_prerun
from django.db.models import F
from redis.exceptions import RedisError

from demo_project.shop.models import Account
from reactor_app import (
    Reactor,
    Step,
    Success,
    from_input,
    from_result,
    step,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.conf import reactor_settings
from reactor_app.coordination.claims import OrderedLockClaim
from reactor_app.coordination.period import bucket_bounds
from reactor_app.coordination.redis import get_client
from reactor_app.fencing import fenced_update
from reactor_app.testing.history import History

#: every lease (not renewed past the bodies: they are shorter); shorter than the claim TTL of
#: the schedule's worker, so a killed holder's lease has lapsed before its redelivery takes
#: over (and drops the dead delivery's holds)
LEASE = 1.0
#: the semaphore's slots
SLOTS = 2
#: the rate limit: RATE admissions per WINDOW seconds (sliding) — a window long enough that a
#: round's executions meet the limit, so a fourth admission a broken window let in is seen
RATE, WINDOW = 3, 2
#: the period's buckets: epoch-aligned and long, so a run stays in one bucket (recorded anyway)
EVERY = 1_000_000

INPUTS = ("key", "history", "hold")
#: a step-level primitive's body comes after ``Reached`` (its result, ``None``)
STEP_INPUTS = (*INPUTS, "reached")


def holder_prefix() -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:holder:"


def deliveries_file() -> str | None:
    """The file delivery starts are appended to (the setting ``FAULT_DELIVERIES_FILE``, which
    the schedules give their worker and themselves), or None: nothing recorded."""
    from django.conf import settings

    return getattr(settings, "FAULT_DELIVERIES_FILE", None)


@task_prerun.connect
def record_delivery(sender: Any = None, **_: Any) -> None:
    """``pid|monotonic ns`` of each delivery's start, before anything of it ran: one
    ``O_APPEND`` write of a short line, so the pool processes never interleave."""
    path = deliveries_file()
    if path and getattr(sender, "name", None) == "reactor_app.run_execution":
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, f"{os.getpid()}|{time.monotonic_ns()}\n".encode())
        finally:
            os.close(descriptor)


def deliveries() -> dict[int, list[int]]:
    """``pid -> delivery starts`` (monotonic ns) recorded by ``record_delivery``."""
    found: dict[int, list[int]] = {}
    path = deliveries_file()
    if not path or not os.path.exists(path):
        return found
    with open(path) as lines:
        for raw in lines:
            pid, at = raw.strip().split("|")
            found.setdefault(int(pid), []).append(int(at))
    return found


def holders() -> dict[str, int]:
    """``primitive -> pid`` of the worker children holding something now (one per holder
    key, a semaphore's two slots each their own)."""
    client = get_client()
    found = {}
    for name in client.scan_iter(match=f"{holder_prefix()}*"):
        pid = client.get(name)
        if pid:
            found[name[len(holder_prefix()) :]] = int(pid)
    return found


def record_hold(primitive: str, args: dict[str, Any], context: Any, **seen: Any) -> Any:
    """Entered (with ``seen``), held for ``hold`` seconds naming this process, release
    invoked and left open."""
    history = History(args["history"])
    key = args["key"]
    # one session per admission: a redelivery of the same execution is a new hold
    session = f"{context.execution_id}:{os.getpid()}:{time.monotonic_ns()}"
    entered = history.invoke(
        session,
        "entered",
        key,
        session=session,
        execution=context.execution_id,
        primitive=primitive,
        pid=os.getpid(),
    )
    entered.ok(**seen)
    name = f"{holder_prefix()}{primitive}:{os.getpid()}"
    # naming the holder is for the kill schedule's aim; the restart schedule's Redis may be
    # down right now, which must not fail the body
    with contextlib.suppress(RedisError):
        get_client().set(name, os.getpid(), px=int(LEASE * 1000))
    time.sleep(args["hold"])
    if "account" in args:
        write_fenced(history, session, args, context)
    with contextlib.suppress(RedisError):
        get_client().delete(name)
    give = {"period": "complete", "rate_limit": None}.get(primitive_of(primitive), "release")
    if give:
        history.invoke(session, give, key, session=session)
    return Success(session)


def write_fenced(history: History, session: str, args: dict[str, Any], context: Any) -> None:
    """The holder's write to its account row through ``fenced_update``, recorded as a fenced
    register's ``write`` (token, accepted)."""
    token = context.fencing_token()
    key = f"account:{args['account']}"
    with history.operation(session, "write", key, token=token) as op:
        accounts = Account.objects.filter(number=args["account"])
        op.ok(accepted=fenced_update(accounts, token, balance=F("balance") + 1) == 1)


class Reached(Step):
    """Records that the execution reached the coordinated step (no coordination of its own)."""

    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        history = History(args["history"])
        process = f"{context.execution_id}:{os.getpid()}"
        history.invoke(process, "reached", args["key"], execution=context.execution_id).ok()
        return Success(None)


@with_lock(lambda args: args["key"], ttl=LEASE)
class LockedHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("lock", args, context, token=context.fencing_token())


@with_semaphore(lambda args: args["key"], limit=SLOTS, ttl=LEASE)
class SemaphoreHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("semaphore", args, context)


@with_rate_limit(lambda args: args["key"], limit=RATE, period=WINDOW)
class RateLimitedHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("rate_limit", args, context)


def period_bucket() -> int:
    return bucket_bounds(EVERY, time.time())[0]


def ordered_position(context: Any) -> list[int]:
    """The place in line of the ordered lock covering this work (the step's or its
    reactor's)."""
    return next(
        [c.position.epoch, c.position.nonce]
        for gate in context.gates
        for c in gate.claims
        if isinstance(c, OrderedLockClaim)
    )


@with_period(lambda args: args["key"], every=EVERY, ttl=LEASE)
class PeriodHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("period", args, context, bucket=period_bucket())


@with_ordered_lock(lambda args: args["key"], poison_pill_timeout=LEASE, strict=False)
class OrderedHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("ordered", args, context, position=ordered_position(context))


class ReactorHold(Step):
    """The body of the reactor-level lock (the step itself coordinates nothing)."""

    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("reactor_lock", args, context, token=context.fencing_token())


class ReactorSemaphoreHold(Step):
    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("reactor_semaphore", args, context)


class ReactorRateLimitHold(Step):
    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("reactor_rate_limit", args, context)


class ReactorPeriodHold(Step):
    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("reactor_period", args, context, bucket=period_bucket())


class ReactorOrderedHold(Step):
    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        position = ordered_position(context)
        return record_hold("reactor_ordered", args, context, position=position)


def _wired(body: type[Step], **after: Any) -> Any:
    return step(
        body,
        key=from_input("key"),
        history=from_input("history"),
        hold=from_input("hold"),
        **after,
    )


def _after_reached(body: type[Step]) -> Any:
    """``body`` once ``reached`` is done (its result is the dependency)."""
    return _wired(body, reached=from_result("reached"))


class StepLock(Reactor):
    inputs = INPUTS
    reached = _wired(Reached)
    held = _after_reached(LockedHold)


class StepSemaphore(Reactor):
    inputs = INPUTS
    reached = _wired(Reached)
    held = _after_reached(SemaphoreHold)


class StepRateLimit(Reactor):
    inputs = INPUTS
    reached = _wired(Reached)
    held = _after_reached(RateLimitedHold)


#: a fenced lock's body writes its account after its hold (``write_fenced``)
FENCED_INPUTS = (*INPUTS, "account")


@with_lock(lambda args: args["key"], ttl=LEASE)
class FencedLockedHold(Step):
    inputs = (*FENCED_INPUTS, "reached")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("fenced_lock", args, context, token=context.fencing_token())


class StepFencedLock(Reactor):
    """A step lock whose holder writes a row through ``fenced_update``."""

    inputs = FENCED_INPUTS
    reached = _wired(Reached)
    held = _wired(FencedLockedHold, account=from_input("account"), reached=from_result("reached"))


class StepPeriod(Reactor):
    inputs = INPUTS
    reached = _wired(Reached)
    held = _after_reached(PeriodHold)


class StepOrdered(Reactor):
    inputs = INPUTS
    reached = _wired(Reached)
    held = _after_reached(OrderedHold)


@with_lock(lambda inputs: inputs["key"], ttl=LEASE)
class ReactorLock(Reactor):
    inputs = INPUTS
    held = _wired(ReactorHold)


@with_semaphore(lambda inputs: inputs["key"], limit=SLOTS, ttl=LEASE)
class ReactorSemaphore(Reactor):
    inputs = INPUTS
    held = _wired(ReactorSemaphoreHold)


@with_rate_limit(lambda inputs: inputs["key"], limit=RATE, period=WINDOW)
class ReactorRateLimit(Reactor):
    inputs = INPUTS
    held = _wired(ReactorRateLimitHold)


@with_period(lambda inputs: inputs["key"], every=EVERY, ttl=LEASE)
class ReactorPeriod(Reactor):
    """Halted, not run, once its bucket is marked."""

    inputs = INPUTS
    held = _wired(ReactorPeriodHold)


@with_ordered_lock(lambda inputs: inputs["key"], poison_pill_timeout=LEASE, strict=False)
class ReactorOrdered(Reactor):
    inputs = INPUTS
    held = _wired(ReactorOrderedHold)


#: primitive (as recorded) -> its reactor
REACTORS: dict[str, type[Reactor]] = {
    "lock": StepLock,
    "semaphore": StepSemaphore,
    "rate_limit": StepRateLimit,
    "period": StepPeriod,
    "ordered": StepOrdered,
    "reactor_lock": ReactorLock,
    "reactor_semaphore": ReactorSemaphore,
    "reactor_rate_limit": ReactorRateLimit,
    "reactor_period": ReactorPeriod,
    "reactor_ordered": ReactorOrdered,
    "fenced_lock": StepFencedLock,
}


def primitive_of(name: str) -> str:
    """The primitive of a recorded name: ``reactor_semaphore`` is a semaphore,
    ``fenced_lock`` a lock."""
    return name.removeprefix("reactor_").removeprefix("fenced_")
