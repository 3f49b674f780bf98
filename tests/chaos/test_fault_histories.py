"""Fault schedules: clients of all five primitives run while the harness kills, pauses and
restarts things; every operation is recorded and the linearizability checker finds no
violation (``reactor_app.testing.linearizability``; docs/operations.md "How coordination is
tested" has the figures).

* **Holders killed and paused** — forked client processes; every half second one is SIGKILLed
  (and replaced) or SIGSTOPped for twice the lease, wherever it is: mid-admission, holding,
  mid-release. A killed call never completes (``info``); a paused holder's lease lapses and
  the next holder legitimately takes it.
* **Redis restarted empty** — a redis-server of the test's own, SIGKILLed and restarted on its
  port with nothing persisted, recorded as a ``lose`` fault.
* **Sentinel failover** — the master of a master + replica + sentinel set SIGKILLed; the
  clients follow the promoted replica (``lose``: the replica may lack the last writes).
* **Cluster master killed** — a private 3-master Redis Cluster with a replica per master; the
  master holding the most of the test's keys is SIGKILLed and its replica promoted.
* **Replies lost** — a proxy between the clients and Redis lets script calls run and loses
  their replies (``reactor_app.testing.fault_proxy``): the client sees a connection error,
  the hold may exist (``info``).
* **Step and reactor level** — a locked step writing a fenced row, through restarts, called
  by ``Step.call`` and run as a reactor's step by ``Reactor.run``: the row's history (a fenced
  register) and the lock's.
* **On real workers** — holders SIGKILLed in ``test_worker_fault_histories``, the worker's
  coordination Redis restarted empty in ``test_worker_restart_histories``, script replies
  lost behind a proxy in ``test_worker_lost_replies``, a Sentinel failover (the master
  SIGKILLed) in ``test_worker_failover_histories``, a cluster master killed in
  ``test_worker_cluster_failover_histories`` (``make soak`` only) — modules of their own:
  each has its module's worker.

Every schedule runs under a ``ClockWatch`` (``reactor_app.testing.clock_watch``): a step of the
machine's wall clock — the one Redis's leases lapse on — against the monotonic clock of the
history is recorded and given to the lease models as slack, and the report says so.

Every schedule prints its counts (operations checked per primitive). The short runs are part
of ``make test``; ``REACTOR_FAULT_SOAK_SECONDS`` lengthens every schedule (``make soak``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from demo_project.shop.models import Account
from reactor_app import Reactor, Step, Success, from_input, step, with_lock
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.redis import get_client
from reactor_app.fencing import fenced_update
from reactor_app.testing.clock_watch import ClockWatch
from reactor_app.testing.fault_proxy import FaultProxy, is_script_call
from reactor_app.testing.history import NEMESIS, History, Operation, operations
from reactor_app.testing.linearizability import check
from reactor_app.testing.sequential_models import FencedRegisterModel, MutexModel
from tests.chaos.fault_histories import (
    LEASE,
    PRIMITIVES,
    ROTATE,
    SOAK,
    Children,
    ClusterWithReplicas,
    RestartableServer,
    assert_no_violation,
    assert_watched,
    clients,
    key_for,
    report,
    running,
    verdicts,
)
from tests.linearizability.workloads import hold_loop, on_threads

pytestmark = [pytest.mark.chaos]


def seconds(short: float) -> float:
    return max(short, SOAK)


@pytest.fixture
def private_server() -> Iterator[RestartableServer]:
    with running(RestartableServer) as server:
        yield server


def on_server(port: int, prefix: str) -> Coordinator:
    """A coordinator on the server at ``port`` through the library's own client for its URL:
    no automatic re-sends (redis-py's default client re-sends a call whose reply was lost, so
    a release that ran reports "not held" on its second run — a fault of that client, not of
    the library's)."""
    return Coordinator(client=get_client(f"redis://127.0.0.1:{port}/0"), prefix=prefix)


def threads_of_all_primitives(
    history: History, schedule: str, make: Any, duration: float, per_primitive: int = 2
) -> None:
    """``per_primitive`` threads per primitive, each with its own client from ``make()``."""
    plan = [p for p in PRIMITIVES for _ in range(per_primitive)]

    def run(n: int) -> int:
        primitive = plan[n]
        return int(
            hold_loop(
                clients(make)[primitive],
                history,
                key_for(primitive, schedule),
                f"{primitive}-t{n}",
                duration=duration,
                hold=(0.0, LEASE / 5),
                failures=0.2,
                seed=n,
                rotate_every=ROTATE,
            )
        )

    on_threads(len(plan), run)


# -- holders killed and paused ---------------------------------------------------------------


#: at most this many extra kills to get one that cuts a call short (each does so about half
#: the time)
KILLS_UNTIL_ONE_LANDS = 30


def test_holders_sigkilled_or_paused_past_their_lease(tmp_path: Path) -> None:
    duration = seconds(8.0)
    children = Children("kill", tmp_path / "history.jsonl", duration)
    rng = random.Random(31)
    kills = pauses = 0
    started = time.monotonic()
    # the children record into the file: the watch's ``clock`` operation goes there too
    with ClockWatch(History(tmp_path / "history.jsonl")):
        try:
            for primitive in PRIMITIVES:
                for _ in range(2):
                    children.spawn(primitive)
            while time.monotonic() - started < duration - 1.0:
                time.sleep(0.5)
                name = rng.choice(sorted(children.running))
                if (kills + pauses) % 2 == 0:  # kill and pause by turns, a random client each
                    children.kill(name)
                    kills += 1
                    left = duration - (time.monotonic() - started)
                    children.spawn(name.split("-p")[0], max(left, 0.5))
                else:
                    children.pause(name)
                    time.sleep(2 * LEASE)  # its leases lapse while it sleeps
                    children.resume(name)
                    pauses += 1
            children.join(duration + 30)
            # A kill lands in a call about half the time (the rest in a hold, between calls): the
            # schedule goes on, two contending lock clients at a time with one of them killed,
            # until one has, so the checker always meets an operation cut short (``info``).
            for _ in range(KILLS_UNTIL_ONE_LANDS):
                if any(o.status == "info" for o in children.operations()):
                    break
                pair = [children.spawn("lock", 2.0) for _ in range(2)]
                time.sleep(rng.uniform(0.3, 0.8))
                children.kill(rng.choice(pair))
                kills += 1
                children.join(10)
        finally:
            children.stop_all()
    ops = children.operations()
    print(f"{kills} holders SIGKILLed, {pauses} paused for {2 * LEASE}s")
    assert kills and pauses
    assert any(o.status == "info" for o in ops), "no kill landed in a call"
    # killed ordered-lock clients leave places in line that wait out the poison pill: few
    # of its operations complete in a short run
    assert_no_violation("kill", verdicts(ops, "kill"), least=3)


# -- Redis restarted empty -------------------------------------------------------------------


def test_redis_restarted_empty(private_server: RestartableServer, redis_prefix: str) -> None:
    history = History()
    duration = seconds(6.0)
    restarts = 0

    def restart_now_and_then(stop: threading.Event) -> None:
        # down for a fifth of a second each time, and never in the run's last second: every
        # client tries a call while the server is down (asserted below)
        nonlocal restarts
        began = time.monotonic()
        while not stop.wait(1.5) and time.monotonic() - began < duration - 1.0:
            fault = history.nemesis("lose", what="redis restarted empty")
            private_server.restart_empty(down=0.2)
            fault.ok()
            restarts += 1

    with ClockWatch(history):
        stop = threading.Event()
        nemesis = threading.Thread(target=restart_now_and_then, args=(stop,))
        nemesis.start()
        try:
            threads_of_all_primitives(
                history, "restart", lambda: on_server(private_server.port, redis_prefix), duration
            )
        finally:
            stop.set()
            nemesis.join(60)
    assert restarts >= 2
    ops = operations(history.events())
    # Every restart came while clients were calling (a call open across it): the faults were
    # in the histories checked. Whether a call saw its connection cut (``info``) or got
    # through before or after the restart is luck; that a restart met calls is not.
    for fault in (o for o in ops if o.process == NEMESIS and o.f == "lose"):
        assert any(
            o.process != NEMESIS
            and o.call < (fault.ret or o.call + 1)
            and (o.ret or fault.call) >= fault.call
            for o in ops
        ), f"no call was open while {fault.describe()}"
    assert_no_violation("restart", verdicts(ops, "restart"))


# -- Sentinel failover -----------------------------------------------------------------------


@pytest.mark.sentinel
def test_sentinel_failover(reactor_redis_sentinel: Any, settings: Any) -> None:
    settings.REACTOR_REDIS_URL = reactor_redis_sentinel.url
    history = History()

    def fail_over() -> None:
        fault = history.nemesis("lose", what="sentinel failover")
        reactor_redis_sentinel.wait_for_failover(reactor_redis_sentinel.kill_master())
        fault.ok()

    ended = threads_through_a_failover(history, "failover", fail_over, seconds(9.0))
    assert ended is not None, "the sentinel never promoted the replica"
    ops = operations(history.events())
    assert any(o.status == "ok" and o.call > ended for o in ops), "no client went on after it"
    assert_no_violation("failover", verdicts(ops, "failover"))


def threads_through_a_failover(
    history: History, schedule: str, fail_over: Callable[[], None], duration: float
) -> int | None:
    """Clients of every primitive on threads (``threads_of_all_primitives``, under a
    ``ClockWatch``) while ``fail_over()`` runs on its own thread, 1.5 s in: when it returned
    (``time.monotonic_ns``), or None when it did not."""
    ended: list[int] = []

    def run() -> None:
        time.sleep(1.5)
        fail_over()
        ended.append(time.monotonic_ns())

    with ClockWatch(history):
        killer = threading.Thread(target=run)
        killer.start()
        try:
            threads_of_all_primitives(history, schedule, Coordinator, duration)
        finally:
            killer.join(60)
    return ended[0] if ended else None


# -- Redis Cluster: a master killed, its replica promoted --------------------------------------


@pytest.fixture
def cluster_with_replicas() -> Iterator[ClusterWithReplicas]:
    with running(lambda: ClusterWithReplicas(masters=3)) as cluster:
        yield cluster.add_replicas()


@pytest.mark.cluster
def test_cluster_master_killed_and_its_replica_promoted(
    cluster_with_replicas: ClusterWithReplicas, settings: Any, redis_prefix: str
) -> None:
    cluster = cluster_with_replicas
    settings.REACTOR_REDIS_URL = (
        "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cluster.replica_of.values()) + "/"
    )
    history = History()

    def fail_over() -> None:
        fault = history.nemesis("lose", what="cluster master killed")
        _, replica = cluster.kill_busiest_master(redis_prefix)
        cluster.wait_promoted(replica)
        fault.ok()

    ended = threads_through_a_failover(history, "cluster", fail_over, seconds(10.0))
    assert ended is not None, "the replica was never promoted"
    ops = operations(history.events())
    assert any(o.status == "ok" and o.call > ended for o in ops), "no client went on after it"
    assert_no_violation("cluster", verdicts(ops, "cluster"))


# -- replies lost ----------------------------------------------------------------------------


def test_script_replies_lost(private_server: RestartableServer, redis_prefix: str) -> None:
    history = History()
    proxy = FaultProxy("127.0.0.1", private_server.port).start()
    stop = threading.Event()

    def lose_some(stop: threading.Event) -> None:
        while not stop.wait(0.05):
            proxy.lose_next_reply(matching=is_script_call)

    with ClockWatch(history):
        nemesis = threading.Thread(target=lose_some, args=(stop,))
        nemesis.start()
        try:
            threads_of_all_primitives(
                history, "lost-reply", lambda: on_server(proxy.port, redis_prefix), seconds(5.0)
            )
        finally:
            stop.set()
            nemesis.join(10)
            proxy.stop()
    ops = operations(history.events())
    unknown = sum(o.status == "info" for o in ops)
    print(f"{proxy.lost} replies lost, {unknown} operations ended with an unknown outcome")
    assert proxy.lost >= 10
    # retry-safe admission: a call whose reply was lost is asked again with its request id and
    # gets the stored reply, so most lost replies never reach the client as an unknown outcome
    assert unknown < proxy.lost / 2, (unknown, proxy.lost)
    assert_no_violation("lost-reply", verdicts(ops, "lost-reply"))


# -- step level ------------------------------------------------------------------------------

STEP_HISTORY: dict[str, History] = {}


@with_lock(lambda args: f"acct:{args['account']}", ttl=LEASE)
class FencedWrite(Step):
    """A locked step that writes its account with its fencing token, recording the write."""

    inputs = ("account", "session", "hold")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        history = STEP_HISTORY["current"]
        key = f"acct:{args['account']}"
        token = context.fencing_token()
        # the acquisition completed before the body could start: record it now
        entered = history.invoke(args["session"], "entered", key, session=args["session"])
        entered.ok(token=token)
        time.sleep(args["hold"])
        with history.operation(args["session"], "write", key, token=token) as op:
            rows = fenced_update(Account.objects.filter(number=args["account"]), token, balance=1)
            op.ok(accepted=rows == 1)
        # the release happens after the body, inside Step.call, and tells nobody whether it
        # freed the hold: an open operation (it may land any time from here on)
        history.invoke(args["session"], "release", key, session=args["session"])
        return Success(token)


class FencedWriteReactor(Reactor):
    """The same locked step, run as a reactor's step (``Reactor.run``)."""

    inputs = ("account", "session", "hold")
    write = step(
        FencedWrite,
        account=from_input("account"),
        session=from_input("session"),
        hold=from_input("hold"),
    )


def call_step(**args: Any) -> str:
    return type(FencedWrite.call(**args)).__name__


def run_reactor(**args: Any) -> str:
    result = FencedWriteReactor.run(**args)
    return "Success" if result.ok else type(result.error).__name__


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("entry", [call_step, run_reactor], ids=["Step.call", "Reactor.run"])
def test_locked_step_through_restarts_writes_only_with_the_newest_token(
    private_server: RestartableServer, settings: Any, entry: Any
) -> None:
    from django.db import connection

    settings.REACTOR_REDIS_URL = f"redis://127.0.0.1:{private_server.port}/0"
    Account.objects.create(number=3131, balance=0)
    history = STEP_HISTORY["current"] = History()
    duration = seconds(5.0)
    stop = threading.Event()

    def restart_now_and_then() -> None:
        while not stop.wait(1.2):
            fault = history.nemesis("lose", what="redis restarted empty")
            private_server.restart_empty()
            fault.ok()

    def caller(n: int) -> int:
        rng = random.Random(n)
        calls = 0
        deadline = time.monotonic() + duration
        try:
            while time.monotonic() < deadline:
                session = f"s{n}-{calls}"
                calls += 1
                hold = rng.uniform(0, LEASE)
                call = history.invoke(f"t{n}", "call", "acct:3131", session=session)
                try:
                    call.ok(outcome=entry(account=3131, session=session, hold=hold))
                except Exception as error:
                    call.info(error=type(error).__name__)
                    time.sleep(0.05)
            return calls
        finally:
            connection.close()

    with ClockWatch(history):
        nemesis = threading.Thread(target=restart_now_and_then)
        nemesis.start()
        try:
            on_threads(4, caller)
        finally:
            stop.set()
            nemesis.join(60)
    ops = operations(history.events())
    # the lock as the bodies saw it: an acquisition spans its call's start to its body's
    # start (the admission happened in between), its lease the step's lease — renewals are
    # not recorded, which only lets the model release a holder earlier than Redis did
    calls = {o.value["session"]: o for o in ops if o.f == "call"}
    acquisitions = [
        Operation(
            o.id,
            o.process,
            "acquire",
            o.key,
            "ok",
            calls[o.value["session"]].call,
            o.ret,
            {"session": o.value["session"], "token": o.value["token"], "ttl": LEASE},
        )
        for o in ops
        if o.f == "entered"
    ]
    releases = [o for o in ops if o.f == "release"]
    assert_watched(ops)
    results = {
        "fenced row": check([o for o in ops if o.f == "write"], FencedRegisterModel()),
        "lock": check(
            acquisitions + releases + [o for o in ops if o.key is None],
            MutexModel(name="step lock"),
        ),
    }
    print(report(f"{entry.__name__} through restarts", results))
    for result in results.values():
        assert result.valid, report(f"{entry.__name__} through restarts", results)
    writes = [o for o in ops if o.f == "write"]
    assert len(writes) >= 10 and any(o.value.get("accepted") for o in writes)
