"""Reactors and scenarios of the fair-sharing and priority tests, importable by the workers.

``FairReactor`` runs one step inside a step-level semaphore of limit 2 shared fairly by
tenant (``fair_by``), ``FairWholeReactor`` the same semaphore around the whole reactor;
``UrgentReactor`` holds a reactor-level lock, ``UrgentStepReactor`` a step-level one. Each body
records its label into a Redis list as it starts: the admission order, read from Redis. A
scenario holds the key itself (as the test's owner) while every execution parks in the key's
line, reads the line from Redis, then releases and wakes what the release granted — from
there on, only the workers and the admission scripts decide who runs when.
"""

from __future__ import annotations

import uuid
from typing import Any

from reactor_app import Reactor, Step, Success, from_input, step, with_lock, with_semaphore
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Claim, Holder, LockClaim, SemaphoreClaim
from reactor_app.coordination.redis import get_client
from reactor_app.engine.enqueueing import wake
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.helpers import wait_until
from tests.worker.reactors import trace_key

FAIR_LIMIT = 2


def fair_key(args: dict[str, Any]) -> str:
    return f"fair:{args['run']}"


@with_semaphore(fair_key, limit=FAIR_LIMIT, ttl=60, fair_by=lambda args: args["tenant"])
class TenantWork(Step):
    inputs = ("run", "tenant", "label")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        get_client().rpush(trace_key(f"order:{args['run']}"), args["label"])
        return Success(args["label"])


class FairReactor(Reactor):
    inputs = ("run", "tenant", "label")

    work = step(
        TenantWork,
        run=from_input("run"),
        tenant=from_input("tenant"),
        label=from_input("label"),
    )


class Record(Step):
    inputs = ("run", "label")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        get_client().rpush(trace_key(f"order:{args['run']}"), args["label"])
        return Success(args["label"])


@with_semaphore(fair_key, limit=FAIR_LIMIT, ttl=60, fair_by=lambda inputs: inputs["tenant"])
class FairWholeReactor(Reactor):
    inputs = ("run", "tenant", "label")

    record = step(Record, run=from_input("run"), label=from_input("label"))


def urgent_key(args: dict[str, Any]) -> str:
    return f"urgent:{args['run']}"


@with_lock(urgent_key, ttl=60)
class UrgentReactor(Reactor):
    inputs = ("run", "label")

    record = step(Record, run=from_input("run"), label=from_input("label"))


@with_lock(urgent_key, ttl=60)
class LockedRecord(Record):
    pass


class UrgentStepReactor(Reactor):
    inputs = ("run", "label")

    record = step(LockedRecord, run=from_input("run"), label=from_input("label"))


def admission_order(run: str) -> list[str]:
    return list(get_client().lrange(trace_key(f"order:{run}"), 0, -1))


def _take(claim: Claim, holders: int) -> list[Admitted]:
    """The test holds ``claim`` (``holders`` owners) before any execution starts."""
    coordinator = Coordinator()
    held = []
    for index in range(holders):
        answer = coordinator.admit([claim], Holder(owner=f"test-holder-{index}"))
        assert isinstance(answer, Admitted), answer
        held.append(answer)
    return held


def _release_once_parked(
    claim: Claim, held: list[Admitted], started: list[Execution], timeout: float
) -> list[str]:
    """Once every execution of ``started`` parked in ``claim``'s line, read the line from
    Redis, then release the test's holds and wake the waiters the releases granted the key
    to (as a gate does). Returns the line as it was, first to be granted first."""
    coordinator = Coordinator()
    line: list[str] = []

    def all_parked() -> bool:
        nonlocal line
        line = coordinator.waiters(claim)
        return len(line) == len(started)

    wait_until(all_parked, timeout, interval=0.1, message="not every execution parked")
    for admitted in held:
        wake(coordinator.release(admitted, "success").woken)
    return line


def _all_succeeded(started: list[Execution], timeout: float) -> None:
    ids = [e.id for e in started]
    wait_until(
        lambda: (
            Execution.objects.filter(id__in=ids, status=ExecutionStatus.SUCCEEDED).count()
            == len(ids)
        ),
        timeout,
        interval=0.2,
        message="not every execution succeeded",
    )


def fair_backlog(
    backlog: int, small: int = 5, timeout: float = 120, reactor: type[Reactor] = FairReactor
) -> tuple[list[str], list[str]]:
    """Tenant ``a`` queues ``backlog`` executions, tenant ``b`` ``small`` behind them, on one
    fair semaphore of limit 2. Returns (the line as parked, the admission order)."""
    run = uuid.uuid4().hex[:8]
    claim = SemaphoreClaim(fair_key({"run": run}), limit=FAIR_LIMIT)
    held = _take(claim, FAIR_LIMIT)
    started = [
        reactor.run_async(run=run, tenant="a", label=f"a-{index:03d}") for index in range(backlog)
    ]
    started += [
        reactor.run_async(run=run, tenant="b", label=f"b-{index:03d}") for index in range(small)
    ]
    line = _release_once_parked(claim, held, started, timeout)
    _all_succeeded(started, timeout)
    labels = {str(e.id): label for e, label in zip(started, _labels(started), strict=True)}
    return [labels[waiter] for waiter in line], admission_order(run)


def priority_line(
    low: int, high: int, timeout: float = 60, reactor: type[Reactor] = UrgentReactor
) -> tuple[list[str], list[str]]:
    """``low`` executions at the default priority, then ``high`` at priority 50, on one lock.
    Returns (the line as parked, the admission order)."""
    run = uuid.uuid4().hex[:8]
    claim = LockClaim(f"urgent:{run}", ttl=60)
    held = _take(claim, 1)
    started = [reactor.run_async(run=run, label=f"low-{index}") for index in range(low)]
    started += [
        reactor.run_async(run=run, label=f"high-{index}", priority=50) for index in range(high)
    ]
    line = _release_once_parked(claim, held, started, timeout)
    _all_succeeded(started, timeout)
    labels = {str(e.id): label for e, label in zip(started, _labels(started), strict=True)}
    return [labels[waiter] for waiter in line], admission_order(run)


def _labels(started: list[Execution]) -> list[str]:
    rows = {e.id: e for e in Execution.objects.filter(id__in=[e.id for e in started])}
    return [str(rows[e.id].inputs["label"]) for e in started]
