"""Reactors of the lost-delivery tests (tests/worker/test_lost_deliveries.py), importable by
workers.

A ``Deadly`` step kills its own pool process (SIGKILL: as the out-of-memory killer or a hard
time limit would) in the first runs of its body, its undo or its compensate — as many as the
order's ``plan`` says for that step (a count the test keeps in Redis; a large number: every
time) — or sleeps ``plan[name]["sleep"]`` seconds in its body (in its first
``plan[name]["sleep_runs"]`` runs, default every one; past a hard time limit, Celery kills the
process) and ``plan[name]["query"]`` seconds inside one database statement, and
computes for ``plan[name]["spin"]`` seconds without yielding as the last thing its body
does. It writes to the order's ledger (``promise_reactors.ledger``): ``enter:<name>`` when its
body starts, ``do:<name>`` when it completes, ``undo:<name>`` and ``compensate:<name>`` when
those hooks complete. A step whose plan says ``fail`` returns a non-retryable failure after
its kills.

``DeadlyReactor``: steps ``s0``, ``s1``, ``s2``. ``DeadlyRated``: ``s0``, then ``s1`` under a
rate limit of ``RATE`` admissions per ``WINDOW`` seconds on the order (each killed run spends
one, so the delivery after ``RATE`` losses parks on it). ``DeadlyLocked``: ``s0``, then ``s1``
under a lock on the order (30 s), then ``s2``; ``DeadlyShortLease`` the same with a lease of
``SHORT_LEASE`` seconds, ``DeadlyOrdered`` with a strict ordered lock on the line
``plan["line"]``, ``DeadlyOrderedRun`` the whole run in such a line. ``DeadlyComposed``:
``a0``, then a composed ``DeadlyChild`` of ``c0`` and ``c1``. ``DeadlyMap``: a sequential
``map_step`` whose elements are ``Deadly`` steps named by their index; ``DeadlyParallelMap``
the same, parallel.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django.db import connection

from reactor_app import (
    Failure,
    Reactor,
    Step,
    Success,
    compose,
    element,
    from_input,
    map_step,
    value,
    with_lock,
    with_ordered_lock,
    with_rate_limit,
)
from reactor_app import step as declare
from reactor_app.coordination.redis import get_client
from tests.worker.promise_reactors import write
from tests.worker.reactors import trace_key

#: kills for "every time"
ALWAYS = 1000


def ran(order: str, name: str, kind: str) -> int:
    """How many times ``kind`` (body, undo, compensate) of step ``name`` started."""
    return int(get_client().get(trace_key(f"ran:{order}:{name}:{kind}")) or 0)


def _maybe_die(args: dict[str, Any], kind: str) -> int:
    """Kill this process in the first ``plan[name][kind]`` runs of ``kind``; else the number of
    this run of ``kind``."""
    plan = args["plan"].get(args["name"], {})
    count = int(get_client().incr(trace_key(f"ran:{args['order']}:{args['name']}:{kind}")))
    if count <= int(plan.get(kind, 0)):
        os.kill(os.getpid(), signal.SIGKILL)
    return count


def _query(seconds: float) -> None:
    """Wait ``seconds`` inside one database statement (PostgreSQL's ``pg_sleep``)."""
    if seconds > 0:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [seconds])


def _spin(seconds: float) -> None:
    """Compute for ``seconds`` without a system call that would yield: on a green pool
    (gevent, eventlet) no other greenlet of the process runs meanwhile."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


class Deadly(Step):
    inputs = ("order", "name", "plan")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        plan = args["plan"].get(args["name"], {})
        write(args["order"], f"enter:{args['name']}")
        run = _maybe_die(args, "body")
        if run <= int(plan.get("sleep_runs", ALWAYS)):
            time.sleep(float(plan.get("sleep", 0)))
        _query(float(plan.get("query", 0)))
        if plan.get("fail"):
            return Failure(f"{args['name']} fails", retryable=False)
        write(args["order"], f"do:{args['name']}")
        _spin(float(plan.get("spin", 0)))  # last: nothing after it yields before the return
        return Success(args["name"])

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        _maybe_die(args, "undo")
        write(args["order"], f"undo:{result}")

    def compensate(self, error: Any, args: dict[str, Any], context: Any) -> None:
        _maybe_die(args, "compensate")
        write(args["order"], f"compensate:{args['name']}")


def _deadly(name: str, step_class: type[Deadly] = Deadly) -> Any:
    return declare(step_class, order=from_input("order"), name=value(name), plan=from_input("plan"))


class DeadlyReactor(Reactor):
    inputs = ("order", "plan")

    s0 = _deadly("s0")
    s1 = _deadly("s1")
    s2 = _deadly("s2")


#: ``DeadlyRated``'s limit on ``s1``: the losses before the verdict spend it, and a window long
#: enough that they all fall in it
RATE, WINDOW = 3, 30


@with_rate_limit(lambda args: f"lost:{args['order']}", limit=RATE, period=WINDOW)
class RatedDeadly(Deadly):
    pass


class DeadlyRated(Reactor):
    inputs = ("order", "plan")

    s0 = _deadly("s0")
    s1 = _deadly("s1", RatedDeadly)


@with_lock(lambda args: f"lost:{args['order']}", ttl=30)
class LockedDeadly(Deadly):
    pass


class DeadlyLocked(DeadlyReactor):
    """``s1`` under a step-level lock on the order, held for far longer than the test runs."""

    s1 = _deadly("s1", LockedDeadly)


#: ``DeadlyShortLease``'s lock lease on ``s1`` (seconds): renewed every third of it while the
#: body runs
SHORT_LEASE = 2


@with_lock(lambda args: f"lease:{args['order']}", ttl=SHORT_LEASE)
class ShortLeaseDeadly(Deadly):
    pass


class DeadlyShortLease(DeadlyReactor):
    """``s1`` under a step-level lock of a ``SHORT_LEASE`` lease."""

    s1 = _deadly("s1", ShortLeaseDeadly)


@with_ordered_lock(lambda args: f"lost-line:{args['plan']['line']}", poison_pill_timeout=60)
class OrderedDeadly(Deadly):
    pass


class DeadlyOrdered(DeadlyReactor):
    """``s1`` under a strict step-level ordered lock on the line ``plan["line"]``."""

    s1 = _deadly("s1", OrderedDeadly)


@with_ordered_lock(lambda inputs: f"lost-run-line:{inputs['plan']['line']}", poison_pill_timeout=60)
class DeadlyOrderedRun(DeadlyReactor):
    """The whole run under a strict reactor-level ordered lock on the line ``plan["line"]``."""


class DeadlyChild(Reactor):
    inputs = ("order", "plan")

    c0 = _deadly("c0")
    c1 = _deadly("c1")


class DeadlyComposed(Reactor):
    inputs = ("order", "plan")

    a0 = _deadly("a0")
    inner = compose(DeadlyChild, order=from_input("order"), plan=from_input("plan"))


class DeadlyMap(Reactor):
    inputs = ("order", "plan", "names")

    each = map_step(
        Deadly,
        over=from_input("names"),
        order=from_input("order"),
        name=element(),
        plan=from_input("plan"),
    )


class DeadlyParallelMap(Reactor):
    inputs = ("order", "plan", "names")

    each = map_step(
        Deadly,
        over=from_input("names"),
        parallel=True,
        order=from_input("order"),
        name=element(),
        plan=from_input("plan"),
    )
