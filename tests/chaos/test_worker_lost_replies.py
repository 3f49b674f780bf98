"""Replies lost under a real worker (issue 31 item 2; the same fault on threads is
``test_fault_histories::test_script_replies_lost``): executions of the small reactors of
``worker_fault_reactors`` — every primitive at step and reactor level, and a step lock whose
holder writes a row through ``fenced_update`` — run on one real ``celery worker -c 4`` whose
``REACTOR_REDIS_URL`` is a ``FaultProxy`` (in this test's process) in front of a
``redis-server`` of the test's own. The proxy lets script calls run and loses their replies
now and then (``lost_replies.ReplyLoser``): the worker sees its connection end, the script
ran. Every primitive at every level has an admission's reply lost (aimed at, and the schedule
extended until it happened), other script calls' replies at random, and a call's retries lose
theirs too, up to the documented bound.

Nothing is lost from the store here, so what is checked is the whole of docs/coordination.md
"Guarantees", with "a lost reply is asked again, not redone":

* each key's history as the bodies saw it, against the models **without** lost state: a
  lock's and an ordered lock's exclusion (tokens and positions in order), a semaphore's
  slots, a rate limit's window, one success per period bucket; the fenced row never accepts a
  write below an accepted token;
* **nothing strands**: every execution succeeds (a reactor-level period's later runs halt) —
  a lost reply is retried with its request id and answered the stored reply, so no hold is
  orphaned, no step fails, nobody waits for a lease or a poison pill to pass;
* afterwards no hold is left, no ordered line has anyone in flight or waiting, and every
  execution on an ordered line took exactly one position (``next`` and the cursor count the
  executions: no position assigned twice, none orphaned) — or, where its place was passed
  over while it still sat in the busy worker's queue (these lines' poison pill is 1 s, and
  the sweep that keeps a queued execution's place runs each second:
  ``engine.waiting_positions``), one more, announced by an ``ordered_skipped`` event
  (``by: "poison_pill"``), never one unannounced;
* **no window charged for nothing**: the server charged each rate limit exactly as many times
  as bodies ran under it (counted by ``MONITOR`` beside the proxy: one charge per admission,
  a retried admission's included).

A module of its own: its worker points at the proxy. ``REACTOR_FAULT_SOAK_SECONDS``
(``make soak``) runs more rounds. The operations checked per primitive and level are printed
(``report``), with the replies lost per name and operation.
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
from reactor_app.testing.fault_proxy import FaultProxy
from reactor_app.testing.history import History, load, operations
from reactor_app.testing.linearizability import check
from reactor_app.testing.servers import StandaloneServer
from tests.chaos.fault_histories import SOAK, report, running
from tests.chaos.lost_replies import Monitor, ReplyLoser
from tests.chaos.worker_fault_reactors import primitive_of
from tests.chaos.worker_histories import (
    FENCED_ACCOUNT,
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
LOST_REPLY_PLAN = {
    "lock": (5, 1),
    "semaphore": (8, 1),
    "rate_limit": (5, 1),
    "period": (4, 2),
    "ordered": (5, 1),
    "reactor_lock": (4, 1),
    "reactor_semaphore": (8, 1),
    "reactor_rate_limit": (5, 1),
    "reactor_period": (4, 2),
    "reactor_ordered": (4, 1),
    "fenced_lock": (5, 1),
}
#: at most this many more batches (two executions of each name not yet met by a lost
#: admission reply) to make sure every name is: the aim makes the first round enough nearly
#: always
MORE_BATCHES = 6
#: seconds every execution gets to end, per batch: claim TTL, sweep, backoffs — with margin
#: for a loaded machine
SETTLED_WITHIN = 90.0


@pytest.fixture(scope="module")
def coordination_server() -> Iterator[StandaloneServer]:
    """The Redis behind the proxy: the test's own, on a free loopback port."""
    with running(StandaloneServer) as server:
        yield server


@pytest.fixture(scope="module")
def fault_proxy(coordination_server: StandaloneServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy("127.0.0.1", coordination_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def celery_worker_settings(
    fault_proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The worker (and the test) coordinate through ``fault_proxy``."""
    return worker_settings(
        tmp_path_factory.mktemp("worker-lost-reply-deliveries"),
        REACTOR_REDIS_URL=f"redis://127.0.0.1:{fault_proxy.port}/0",
    )


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """More pool processes than the semaphore's slots."""
    return 4


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_all_primitives_on_real_workers_with_script_replies_lost(
    worker: Any,
    coordination_server: StandaloneServer,
    fault_proxy: FaultProxy,
    tmp_path: Path,
    clock_watch: Callable[[History], ClockWatch],
) -> None:
    from demo_project.shop.models import Account
    from reactor_app.models import CoordinationEvent, Execution
    from reactor_app.testing import coordination_state
    from tests.chaos.worker_fault_reactors import deliveries

    Account.objects.create(number=FENCED_ACCOUNT, balance=0)
    path = tmp_path / "history.jsonl"
    watch = clock_watch(History(path))  # stopped before the history is read back
    rng = random.Random(31)
    loser = ReplyLoser(seed=31)
    monitor = Monitor(coordination_server.port, tmp_path / "monitor.txt").start()
    stop = threading.Event()

    def keep_armed() -> None:
        # one fault armed at a time: the loser decides request by request
        while not stop.wait(0.01):
            if not fault_proxy.armed:
                fault_proxy.lose_next_reply(matching=loser)

    nemesis = threading.Thread(target=keep_armed)
    nemesis.start()
    plan: list[tuple[str, str]] = []
    enqueued: dict[str, tuple[str, int]] = {}
    extra = 0
    began = time.monotonic()
    try:
        rounds = 1 + int(SOAK // 15)
        batch, more = enqueue(LOST_REPLY_PLAN, rounds, path, rng)
        loser.add_stems(batch)
        plan, enqueued = plan + batch, {**enqueued, **more}
        wait_settled(more, SETTLED_WITHIN * rounds)
        first_round = time.monotonic() - began
        # every name met by a lost admission reply: more executions of those not yet
        while extra < MORE_BATCHES:
            missing = {n for n in LOST_REPLY_PLAN if not loser.admissions_lost()[n]}
            if not missing:
                break
            extra += 1
            batch, more = enqueue({n: (2, 1) for n in sorted(missing)}, 1, path, rng)
            loser.add_stems(batch)
            plan, enqueued = plan + batch, {**enqueued, **more}
            wait_settled(more, SETTLED_WITHIN)
    finally:
        stop.set()
        nemesis.join(10)
        fault_proxy.disarm()
        monitor.stop()
    lost = loser.admissions_lost()
    assert all(lost[n] for n in LOST_REPLY_PLAN), f"no admission reply lost for some: {lost}"
    assert fault_proxy.lost == len(loser.lost), (fault_proxy.lost, len(loser.lost))

    # every execution succeeded (a reactor-level period's later runs halt): a lost reply was
    # asked again and answered, nothing failed or waited out a lease
    runs = Execution.objects.filter(pk__in=list(enqueued))
    outcomes = Counter(run.status for run in runs)
    for run in runs:
        name = enqueued[str(run.pk)][0]
        allowed = ("succeeded", "halted") if name == "reactor_period" else ("succeeded",)
        assert run.status in allowed, (name, run.status, run.error)

    watch.stop()
    ops = operations(load(path))
    state = coordination_state()
    # nothing is left held (a release is made after its body recorded its end: a moment)
    deadline = time.monotonic() + 10
    while state.holds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.holds() == [], state.holds()
    # every execution on a line took one position, ran it and completed it: none orphaned;
    # a place passed over while its execution sat in the queue was taken again, announced
    per_key = Counter(key for name, key in plan)
    retaken = Counter(
        event.key
        for event in CoordinationEvent.objects.filter(kind="ordered_skipped")
        if event.detail.get("by") == "poison_pill"
    )
    for key in {key for name, key in plan if is_ordered(name)}:
        line = state.ordered_lock(key)
        assert line.in_flight is None and not line.positions, (key, line)
        positions = per_key[key] + retaken[key]
        assert line.next - 1 == line.last_completed == positions, (key, line, per_key[key])
        seen = [tuple(o.value["position"]) for o in ops if o.f == "entered" and o.key == key]
        assert len(seen) == len(set(seen)) == per_key[key], (key, seen)
    # no window charged for nothing: one charge per body that ran under it
    charges = monitor.rate_limit_charges()
    for key in {key for name, key in plan if primitive_of(name) == "rate_limit"}:
        bodies = sum(1 for o in ops if o.f == "entered" and o.key == key)
        assert charges[key] == bodies == per_key[key], (key, charges[key], bodies)

    started = deliveries()
    assert {o.value["pid"] for o in ops if o.f == "entered"} <= set(started)
    histories = worker_histories(ops, enqueued, started)
    models = models_for(histories)
    names = [*LOST_REPLY_PLAN, "fenced row"]
    results = {name: check(histories[name], models[name]) for name in names}
    text = report(f"script replies lost ({fault_proxy.lost}) on real workers", results)
    print(text)
    by_operation = Counter(
        (o.name or "other", o.operation + (" (resend)" if o.resend else "")) for o in loser.lost
    )
    print(
        f"  executions: {dict(outcomes)}; first round {first_round:.1f} s, then {extra} more "
        f"batches, {time.monotonic() - began:.1f} s in all"
    )
    print(f"  admission replies lost per name: {dict(lost)}")
    print(f"  places passed over in the queue and taken again: {dict(retaken)}")
    print(f"  replies lost per (name, operation): {dict(sorted(by_operation.items()))}")
    for result in results.values():
        assert result.valid, text

    # the fenced row counts exactly the writes it accepted, and some were made
    writes = [o for o in ops if o.f == "write" and o.status == "ok"]
    accepted = [o for o in writes if o.value["accepted"]]
    assert accepted
    assert Account.objects.get(number=FENCED_ACCOUNT).balance == len(accepted)
    # every execution that succeeded, but a period's (whose bucket may be done), ran its body
    ran = {o.value["execution"] for o in ops if o.f == "entered"}
    succeeded = {str(pk) for pk in runs.filter(status="succeeded").values_list("pk", flat=True)}
    assert {e for e in succeeded if not is_period(enqueued[e][0])} <= ran
