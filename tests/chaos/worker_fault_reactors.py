"""Small reactors recording their holds, one per primitive and level, for the fault schedule
on real workers (tests/chaos/test_worker_fault_histories.py), in a module of its own so that
Celery worker processes import them by their registered path.

Every coordinated body records into the schedule's history file (``reactor_app.testing.
history``: one ``O_APPEND`` write per event, so the worker processes and the test share it):
that it entered, with what its admission gave it (fencing token, ordered position, period
bucket), then — as its last act — the release it is about to make, left open (the release
happens after the body and nobody is told whether it freed the hold; a rate limit gives
nothing back). While it holds its key it names its process in Redis, so the schedule can kill
the holder.

When was each admission? After the start of the delivery that ran the body — the latest task
the body's process started (``task_prerun``, recorded in Redis: a pool process runs one task at
a time); after ``Reached``, the step before each step-level primitive; after the enqueue (the
test records it). The test places an admission from the latest of those to the body's start.
The worker imports this module at its start (``CELERY_IMPORTS`` of the test's settings), so
the signal is connected in every pool process before its first task.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import task_prerun

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
from reactor_app.testing.history import History

#: every lease (not renewed past the bodies: they are shorter); shorter than the claim TTL of
#: the schedule's worker, so a killed holder's lease has lapsed before its redelivery takes
#: over (and drops the dead delivery's holds)
LEASE = 1.0
#: the semaphore's slots
SLOTS = 2
#: the rate limit: RATE admissions per WINDOW seconds (sliding)
RATE, WINDOW = 3, 1
#: the period's buckets: epoch-aligned and long, so a run stays in one bucket (recorded anyway)
EVERY = 1_000_000

INPUTS = ("key", "history", "hold")
#: a step-level primitive's body comes after ``Reached`` (its result, ``None``)
STEP_INPUTS = (*INPUTS, "reached")


def holder_prefix() -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:holder:"


def deliveries_key() -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:deliveries"


@task_prerun.connect
def record_delivery(sender: Any = None, **_: Any) -> None:
    """``pid|monotonic ns`` of each delivery's start, before anything of it ran."""
    if getattr(sender, "name", None) == "reactor_app.run_execution":
        get_client().rpush(deliveries_key(), f"{os.getpid()}|{time.monotonic_ns()}")


def deliveries() -> dict[int, list[int]]:
    """``pid -> delivery starts`` (monotonic ns) recorded by ``record_delivery``."""
    found: dict[int, list[int]] = {}
    for raw in get_client().lrange(deliveries_key(), 0, -1):
        pid, at = raw.split("|")
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
    client = get_client()
    name = f"{holder_prefix()}{primitive}:{os.getpid()}"
    client.set(name, os.getpid(), px=int(LEASE * 1000))
    time.sleep(args["hold"])
    client.delete(name)
    give = {"period": "complete", "rate_limit": None}.get(primitive, "release")
    if give:
        history.invoke(session, give, key, session=session)
    return Success(session)


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


@with_period(lambda args: args["key"], every=EVERY, ttl=LEASE)
class PeriodHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        bucket = bucket_bounds(EVERY, time.time())[0]
        return record_hold("period", args, context, bucket=bucket)


@with_ordered_lock(lambda args: args["key"], poison_pill_timeout=LEASE, strict=False)
class OrderedHold(Step):
    inputs = STEP_INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        position = next(
            [c.position.epoch, c.position.nonce]
            for gate in context.gates
            for c in gate.claims
            if isinstance(c, OrderedLockClaim)
        )
        return record_hold("ordered", args, context, position=position)


class ReactorHold(Step):
    """The body of the reactor-level lock (the step itself coordinates nothing)."""

    inputs = INPUTS

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return record_hold("reactor_lock", args, context, token=context.fencing_token())


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


#: primitive (as recorded) -> its reactor
REACTORS: dict[str, type[Reactor]] = {
    "lock": StepLock,
    "reactor_lock": ReactorLock,
    "semaphore": StepSemaphore,
    "rate_limit": StepRateLimit,
    "period": StepPeriod,
    "ordered": StepOrdered,
}
