"""The fault schedule on real workers (issue 31 item 2; the other schedules, on threads and
forked processes, are ``test_fault_histories``): executions of six small reactors
(``worker_fault_reactors``) — a step-level lock, semaphore, rate limit, period and ordered
lock, and a reactor-level lock — run interleaved by one real ``celery worker -c 4`` while the
pool process holding something is SIGKILLed again and again; the killed deliveries are
redelivered and take over. Each key's history as the bodies saw it (``worker_histories``) is
checked against its primitive's model. A module of its own: it configures the module's worker.
``REACTOR_FAULT_SOAK_SECONDS`` (``make soak``) runs more rounds.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reactor_app.coordination.period import bucket_bounds
from reactor_app.testing.history import Operation, load, operations
from reactor_app.testing.linearizability import Model, check
from reactor_app.testing.sequential_models import (
    MutexModel,
    PeriodModel,
    RateLimitModel,
    SemaphoreModel,
)
from tests.chaos.fault_histories import SOAK, report

pytestmark = [pytest.mark.chaos]

#: the real worker of ``test_all_primitives_on_real_workers_with_holders_sigkilled`` (``worker``
#: fixture, started only for it): short claims and sweeps, so that killed deliveries come back
#: within the run (claim TTL 3 s: longer than every lease, see ``worker_fault_reactors.LEASE``)
WORKER_SETTINGS = {
    "REACTOR_CONTENTION_CEILING": 1000,
    "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
    "REACTOR_EXECUTION_CLAIM_TTL": 3,
    "REACTOR_SWEEP_INTERVAL": 1,
    "REACTOR_SWEEP_AFTER": 5,
    # connects the delivery recorder in the worker before its pool forks
    "CELERY_IMPORTS": ["tests.chaos.worker_fault_reactors"],
}


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """More pool processes than the semaphore's slots: a third holder could be admitted."""
    return 4


#: executions per primitive (and keys) of one round on the worker; ``make soak`` runs more
#: rounds (one per 15 s of ``REACTOR_FAULT_SOAK_SECONDS``), each on keys of its own
WORKER_PLAN = {
    "lock": (6, 1),
    "reactor_lock": (5, 1),
    "semaphore": (7, 1),
    "rate_limit": (8, 1),
    "period": (9, 3),
    "ordered": (6, 1),
}
#: holders SIGKILLed per round: the schedule stops killing then (or once all have settled)
KILLS_PER_ROUND = 8


def worker_models() -> dict[str, Model]:
    from tests.chaos.worker_fault_reactors import SLOTS

    return {
        "lock": MutexModel(name="step lock on workers"),
        "reactor_lock": MutexModel(name="reactor lock on workers"),
        "semaphore": SemaphoreModel(name="step semaphore on workers", limit=SLOTS),
        "rate_limit": RateLimitModel(name="step rate limit on workers"),
        "period": PeriodModel(name="step period on workers"),
        "ordered": MutexModel(name="step ordered lock on workers", order_field="position"),
    }


def worker_histories(
    ops: list[Operation], enqueued: dict[str, tuple[str, int]], started: dict[int, list[int]]
) -> dict[str, list[Operation]]:
    """Each primitive's history as its bodies saw it. An admission is placed from the latest
    moment the execution is known to have been before it — the start of the delivery running
    the body (``started``: the latest task start of the body's process before it; a
    reactor-level lock is taken in that delivery too, as these reactors never park after
    it), ``Reached`` (the step before a step-level primitive) done, the enqueue — to its body's
    start, with what the body was given (token, position, bucket) and
    the claim's lease or window; a rate limit's admission is its charge, spent even when the
    body is killed. Releases (a period's complete) are invoked at the body's end and left
    open: the worker releases after the body, and may be killed first."""
    from tests.chaos.worker_fault_reactors import LEASE as WORKER_LEASE
    from tests.chaos.worker_fault_reactors import RATE, SLOTS, WINDOW

    claims: dict[str, dict[str, Any]] = {
        "lock": {"ttl": WORKER_LEASE},
        "reactor_lock": {"ttl": WORKER_LEASE},
        "semaphore": {"ttl": WORKER_LEASE, "limit": SLOTS},
        "rate_limit": {"window": WINDOW, "limit": RATE, "cost": 1},
        "period": {"ttl": WORKER_LEASE},
        # a silent holder is passed over after the poison pill: that is its lease
        "ordered": {"ttl": WORKER_LEASE},
    }
    reached: dict[str, list[int]] = {}
    for o in ops:
        if o.f == "reached" and o.ret is not None:
            reached.setdefault(o.value["execution"], []).append(o.ret)
    histories: dict[str, list[Operation]] = {p: [] for p in claims}
    primitive_of = {o.value["session"]: o.value["primitive"] for o in ops if o.f == "entered"}

    def holder(session: str) -> str:
        # an ordered lock's hold is the execution's place in line, kept across deliveries: a
        # redelivery after a kill resumes it (same position); every other hold is one admission
        if primitive_of[session] == "ordered":
            return session.split(":")[0]
        return session

    keys: dict[str, str] = {}  # session -> the key its operations are checked under
    for o in ops:
        if o.f != "entered" or o.status != "ok":
            continue
        execution, primitive = o.value["execution"], o.value["primitive"]
        before = [t for t in reached.get(execution, []) if t <= o.call]
        before += [t for t in started.get(o.value["pid"], []) if t <= o.call]
        call = max([enqueued[execution][1], *before])
        key = f"{o.key}@{o.value['bucket']}" if primitive == "period" else str(o.key)
        keys[o.value["session"]] = key
        seen = {k: o.value[k] for k in ("token", "position") if o.value.get(k) is not None}
        session = holder(o.value["session"])
        histories[primitive].append(
            Operation(
                o.id,
                o.process,
                "admit" if primitive == "period" else "acquire",
                key,
                "ok",
                call,
                o.ret,
                {"session": session, **claims[primitive], **seen},
            )
        )
    for o in ops:
        if o.f in ("release", "complete") and o.value["session"] in keys:
            session = o.value["session"]
            value = {**o.value, "session": holder(session)}
            histories[primitive_of[session]].append(
                Operation(o.id, o.process, o.f, keys[session], o.status, o.call, o.ret, value)
            )
    return histories


def killed_in_its_delivery(
    body: Operation, killed: dict[int, int], started: dict[int, list[int]]
) -> bool:
    """Whether the process running ``body`` was killed before its delivery ended (before the
    process started its next task): the body, or the release after it, may not have
    finished."""
    pid = body.value["pid"]
    if pid not in killed:
        return False
    later = [t for t in started.get(pid, []) if t > body.call]
    return body.call < killed[pid] < min(later, default=2**63)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_all_primitives_on_real_workers_with_holders_sigkilled(worker: Any, tmp_path: Path) -> None:
    """Executions of six small reactors, enqueued interleaved on one real ``celery worker -c
    4`` — a step-level lock, semaphore (2 slots), rate limit (3 per second), period and
    ordered lock, and a reactor-level lock — while the worker child holding something is
    SIGKILLed again and again (mid-body: after its admission, before its release; the
    primitive killed least so far first). Killed deliveries are redelivered (``acks_late``),
    take over and run again. Each key's history as the bodies saw it (``worker_histories``)
    is linearizable against its primitive's model; per period bucket, at most one body ran to
    its end, and it belongs to the execution that marked the bucket."""
    from reactor_app.models import Execution
    from reactor_app.testing import coordination_state
    from tests.chaos.test_worker_chaos import worker_children
    from tests.chaos.worker_fault_reactors import EVERY, REACTORS, deliveries, holders

    path = tmp_path / "history.jsonl"
    rng = random.Random(31)
    rounds = 1 + int(SOAK // 15)
    plan = []
    for _ in range(rounds):
        for primitive, (count, keys) in WORKER_PLAN.items():
            stem = f"{primitive}:{secrets.token_hex(3)}"
            plan += [(primitive, f"{stem}:{n % keys}") for n in range(count)]
    rng.shuffle(plan)
    enqueued: dict[str, tuple[str, int]] = {}  # execution -> (primitive, enqueued at)
    for primitive, key in plan:
        at = time.monotonic_ns()
        execution = REACTORS[primitive].run_async(
            key=key, history=str(path), hold=rng.uniform(0.1, 0.3)
        )
        enqueued[str(execution.id)] = (primitive, at)

    settled = ("succeeded", "failed", "cancelled", "halted")

    def unsettled() -> bool:
        pending = Execution.objects.filter(pk__in=list(enqueued)).exclude(status__in=settled)
        return pending.exists()

    kills: Counter[str] = Counter({primitive: 0 for primitive in WORKER_PLAN})
    killed: dict[int, int] = {}  # pid -> when it was killed
    end = time.monotonic() + 90 * rounds
    while sum(kills.values()) < KILLS_PER_ROUND * rounds and unsettled():
        assert time.monotonic() < end, "executions still running past the recovery bound"
        children = worker_children(worker.process.pid)
        held = [(n.split(":")[0], pid) for n, pid in holders().items() if pid in children]
        if not held:
            time.sleep(0.02)  # polling for the next holder
            continue
        primitive, pid = min(held, key=lambda h: (kills[h[0]], rng.random()))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        kills[primitive] += 1
        killed[pid] = time.monotonic_ns()
        time.sleep(0.3)  # the schedule's pace: let the pool replace its child
    while unsettled():
        assert time.monotonic() < end, "executions still running past the recovery bound"
        time.sleep(0.2)
    statuses = Counter(
        Execution.objects.filter(pk__in=list(enqueued)).values_list("status", flat=True)
    )
    assert statuses == {"succeeded": len(enqueued)}, statuses
    assert sum(kills.values()) >= 4, f"only {dict(kills)} holders killed"

    ops = operations(load(path))
    started = deliveries()
    # every body's delivery start is known (the recorder ran in every pool process)
    assert {o.value["pid"] for o in ops if o.f == "entered"} <= set(started)
    histories = worker_histories(ops, enqueued, started)
    models = worker_models()
    results = {p: check(histories[p], models[p]) for p in models}
    text = report("holders SIGKILLed on real workers", results)
    print(text)
    print("  holders killed: " + ", ".join(f"{p} {n}" for p, n in kills.items()))
    for result in results.values():
        assert result.valid, text

    entered = [o for o in ops if o.f == "entered"]
    # every execution got in (its step's body ran), a period's only while its bucket was open
    ran = {o.value["execution"] for o in entered}
    assert {e for e, (p, _) in enqueued.items() if p != "period"} <= ran
    # one success per period bucket: at most one body not killed, the marking execution's
    period_keys = {key for primitive, key in plan if primitive == "period"}
    state = coordination_state()
    now = bucket_bounds(EVERY, time.time())[0]
    for key in period_keys:
        bodies = [o for o in entered if o.key == key]
        assert bodies, f"no body ran for {key}"
        for bucket in {o.value["bucket"] for o in bodies}:
            finished = [
                o
                for o in bodies
                if o.value["bucket"] == bucket and not killed_in_its_delivery(o, killed, started)
            ]
            assert len(finished) <= 1, f"{len(finished)} bodies finished in {key}@{bucket}"
            if finished and bucket == now:
                assert finished[0].value["execution"] == state.period_marked_by(key, EVERY)
