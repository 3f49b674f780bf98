"""The coordination Redis restarted empty under real workers (issue 31 item 2; the same fault
on threads is ``test_fault_histories::test_redis_restarted_empty``): executions of the small
reactors of ``worker_fault_reactors`` — every primitive at step and reactor level, and a step
lock whose holder writes a row through ``fenced_update`` — run on one real ``celery worker -c
4`` whose ``REACTOR_REDIS_URL`` is a ``redis-server`` of the test's own, SIGKILLed and started
again empty on its port now and then (holds, claims, lines, marks, windows and fence counters
all gone; the broker and the database are elsewhere and keep everything).

What is checked is what docs/coordination.md "Guarantees" promises across lost state, no more:

* each key's history as the bodies saw it, with every restart a ``lose`` fault — a lost hold
  may be taken again at once (so a lock's or semaphore's exclusion is **not** promised across
  a restart: two bodies may overlap there), a rate limit's window and a period's mark may be
  forgotten (a bucket may run again), an ordered line numbers its positions again; but
  **fencing tokens never go backwards** per key, across restarts too;
* the fenced row: ``fenced_update`` never accepts a write below an accepted token (the fenced
  register) — that, not the lock, is what keeps a holder whose hold vanished from writing
  after its successor;
* **nothing strands**: every execution ends terminal within the recovery bound without an
  operator, and once they have, no hold is left in Redis (after at most a lease) and no
  ordered line has anyone in flight. A run whose hold vanished under its body may fail (its
  step's lease is reported lost, ``LeaseLost``; these steps have one attempt); no other
  failure is accepted.

A module of its own: its worker points at the test's server. ``REACTOR_FAULT_SOAK_SECONDS``
(``make soak``) runs more rounds and restarts. The operations checked per primitive and level
are printed (``report``); one run's figures are in docs/operations.md "How coordination is
tested".
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.history import History, load, operations
from reactor_app.testing.linearizability import check
from tests.chaos.fault_histories import SOAK, RestartableServer, report, running
from tests.chaos.worker_histories import (
    FENCED_ACCOUNT,
    LOST_STATE_PLAN,
    enqueue,
    is_ordered,
    is_period,
    models_for,
    wait_settled,
    worker_histories,
    worker_settings,
)

pytestmark = [pytest.mark.chaos]

#: executions per recorded name (and keys) of one round; ``make soak`` runs one round per
#: 15 s of ``REACTOR_FAULT_SOAK_SECONDS``, each on keys of its own
RESTART_PLAN = LOST_STATE_PLAN
#: restarts per round, RESTART_EVERY seconds apart (the first once bodies are running)
RESTARTS_PER_ROUND = 5
RESTART_EVERY = 0.8
#: seconds every execution gets to end, per round: claim TTL, sweep, backoffs — with margin
#: for a loaded machine
SETTLED_WITHIN = 90.0


@pytest.fixture(scope="module")
def coordination_server() -> Iterator[RestartableServer]:
    """The worker's coordination Redis: the test's own, on a free loopback port."""
    with running(RestartableServer) as server:
        yield server


@pytest.fixture(scope="module")
def celery_worker_settings(
    coordination_server: RestartableServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The worker (and the test) coordinate through ``coordination_server``."""
    return worker_settings(
        tmp_path_factory.mktemp("worker-restart-deliveries"),
        REACTOR_REDIS_URL=f"redis://127.0.0.1:{coordination_server.port}/0",
    )


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """More pool processes than the semaphore's slots."""
    return 4


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_all_primitives_on_real_workers_with_redis_restarted_empty(
    worker: Any,
    coordination_server: RestartableServer,
    tmp_path: Path,
    clock_watch: Callable[[History], ClockWatch],
) -> None:
    from demo_project.shop.models import Account
    from reactor_app.models import Execution
    from reactor_app.testing import coordination_state
    from tests.chaos.worker_fault_reactors import deliveries

    Account.objects.create(number=FENCED_ACCOUNT, balance=0)
    path = tmp_path / "history.jsonl"
    watch = clock_watch(History(path))  # stopped before the history is read back
    history = History(path)
    rng = random.Random(31)
    rounds = 1 + int(SOAK // 15)
    plan, enqueued = enqueue(RESTART_PLAN, rounds, path, rng)

    def entered() -> int:
        return sum(1 for e in load(path) if e.f == "entered" and e.type == "ok")

    restarts = 0
    stop = threading.Event()

    def restart_now_and_then() -> None:
        nonlocal restarts
        # the first restart once a few bodies have run, so that holds exist to lose
        while entered() < 3 and not stop.wait(0.05):
            pass
        while restarts < RESTARTS_PER_ROUND * rounds and not stop.wait(RESTART_EVERY):
            fault = history.nemesis("lose", what="coordination redis restarted empty")
            coordination_server.restart_empty()
            fault.ok()
            restarts += 1

    nemesis = threading.Thread(target=restart_now_and_then)
    nemesis.start()
    try:
        wait_settled(enqueued, SETTLED_WITHIN * rounds)
    finally:
        stop.set()
        nemesis.join(60)
    assert restarts >= 2, f"only {restarts} restarts before every execution ended"

    # every execution ended; a failure only where its step's hold vanished under its body
    runs = Execution.objects.filter(pk__in=list(enqueued))
    outcomes = Counter(run.status for run in runs)
    for run in runs:
        name = enqueued[str(run.pk)][0]
        if run.status == "failed":
            assert "LeaseLost" in str(run.error), (name, run.error)
        else:
            allowed = ("succeeded", "halted") if name == "reactor_period" else ("succeeded",)
            assert run.status in allowed, (name, run.status, run.error)

    # nothing is left held: every hold was released, or lapses with its lease
    state = coordination_state()
    deadline = time.monotonic() + 10
    while state.holds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.holds() == [], state.holds()
    for key in {key for name, key in plan if is_ordered(name)}:
        line = state.ordered_lock(key)
        assert line.in_flight is None and not line.positions, (key, line)

    watch.stop()
    ops = operations(load(path))
    started = deliveries()
    assert {o.value["pid"] for o in ops if o.f == "entered"} <= set(started)
    histories = worker_histories(ops, enqueued, started)
    models = models_for(histories, lost_state=True)
    results = {name: check(histories[name], models[name]) for name in [*RESTART_PLAN, "fenced row"]}
    text = report(f"coordination Redis restarted empty ({restarts}) on real workers", results)
    print(text)
    # a restart that emptied the store under a running body: the case the fault is about
    ends = {o.value["session"]: o.call for o in ops if o.f in ("release", "complete")}
    faults = [o for o in ops if o.f == "lose"]
    mid_body = [
        f
        for f in faults
        if any(
            o.ret is not None and o.ret < f.call < ends.get(o.value["session"], 0)
            for o in ops
            if o.f == "entered"
        )
    ]
    # (every failure is a LeaseLost: asserted above)
    print(f"  executions: {dict(outcomes)}; restarts under a running body: {len(mid_body)}")
    for result in results.values():
        assert result.valid, text
    assert mid_body, "no restart landed while a body held its key"

    # the row counts exactly the writes it accepted; some were made, and a write was refused
    # only after one with a higher token had begun (a stale holder's, not a current one's)
    writes = [o for o in ops if o.f == "write" and o.status == "ok"]
    accepted = [o for o in writes if o.value["accepted"]]
    assert accepted
    assert Account.objects.get(number=FENCED_ACCOUNT).balance == len(accepted)
    for refused in (o for o in writes if not o.value["accepted"]):
        assert any(
            a.value["token"] > refused.value["token"] and a.call < (refused.ret or 2**63)
            for a in accepted
        ), refused
    # every execution that succeeded, but a period's (whose bucket may be done), ran its body
    ran = {o.value["execution"] for o in ops if o.f == "entered"}
    succeeded = {str(pk) for pk in runs.filter(status="succeeded").values_list("pk", flat=True)}
    assert {e for e in succeeded if not is_period(enqueued[e][0])} <= ran
