"""Concurrency claims of the coordination primitives, at the Coordinator level.

Real Redis, real parallelism: forked processes (and a few threads), each recording when it
entered and left the protected section with ``time.monotonic_ns()`` (one system-wide clock on
Linux, so intervals from different processes compare). Overlaps are detected from those
records; rate-limit admissions are checked on the Redis ``TIME`` the admission itself returned.
No fakes, no mocked clocks. No Django database is used.

Redis is the configured coordination Redis; each test uses the suite's per-test key prefix
(``redis_prefix``), whose keys alone are deleted afterwards.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis
import redis.connection

from reactor_app.coordination import holds_index, rate_limit, state, subscriptions
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Claim,
    Holder,
    LockClaim,
    OrderedLockClaim,
    OrderedPosition,
    PeriodClaim,
    PeriodHit,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.redis import get_client, redis_url
from reactor_app.coordination.renewal import Renewal, scheduler
from reactor_app.coordination.scripts import scripts_for
from tests.concurrency.harness import command_calls, probe_across_edge, redis_micros
from tests.renewing import KEPT_LEASE

FORK = multiprocessing.get_context("fork")

Interval = tuple[int, int]  # (entered ns, left ns), time.monotonic_ns()


# -- harness ----------------------------------------------------------------------------------


@pytest.fixture(
    scope="module", params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)]
)
def url(request: pytest.FixtureRequest) -> str:
    """Every primitive test runs on the suite's Redis and on a real 3-master Redis Cluster
    (its keys are left to the throw-away cluster: each test has a prefix of its own)."""
    if request.param == "cluster":
        return str(request.getfixturevalue("reactor_redis_cluster").url)
    return redis_url()


@pytest.fixture
def prefix(redis_prefix: str) -> str:
    """The suite's per-test key prefix (set in settings, cleaned up after the test)."""
    return redis_prefix


@pytest.fixture
def coordinator(url: str, prefix: str) -> Coordinator:
    return Coordinator(client=get_client(url), prefix=prefix)


def child_coordinator(url: str, prefix: str) -> Coordinator:
    # after fork the client cache is empty (os.register_at_fork): a pool of the child's own
    return Coordinator(client=get_client(url), prefix=prefix)


def run_processes(target: Callable[..., Any], arg_list: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``target(*args)`` in one forked process per entry; their return values, in order."""
    results = FORK.Queue()

    def child(index: int, args: tuple[Any, ...]) -> None:
        try:
            results.put((index, True, target(*args)))
        except BaseException:
            results.put((index, False, traceback.format_exc()))

    processes = [FORK.Process(target=child, args=(i, a)) for i, a in enumerate(arg_list)]
    for process in processes:
        process.start()
    collected: dict[int, Any] = {}
    try:
        for _ in processes:
            index, ok, value = results.get(timeout=60)
            assert ok, f"child {index} failed:\n{value}"
            collected[index] = value
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
    return [collected[i] for i in range(len(processes))]


def overlapping(intervals: Sequence[Interval]) -> list[tuple[Interval, Interval]]:
    ordered = sorted(intervals)
    return [(a, b) for a, b in itertools.pairwise(ordered) if b[0] < a[1]]


def peak_concurrency(intervals: Sequence[Interval]) -> int:
    # at equal instants a departure counts before an arrival: touching is not overlapping
    events = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def holder(name: str) -> Holder:
    return Holder(owner=name, execution_id=f"exec-{name}", step="work", reactor="tests.Primitives")


# -- lock -----------------------------------------------------------------------------------


def lock_rounds(
    url: str, prefix: str, worker: int, rounds: int, user_key: str, body_seconds: float
) -> list[tuple[int, int, int]]:
    coordinator = child_coordinator(url, prefix)
    records = []
    for round_ in range(rounds):
        admitted = coordinator.admit_waiting(
            [LockClaim(user_key, ttl=10)], holder(f"w{worker}-{round_}"), 30
        )
        assert isinstance(admitted, Admitted), admitted
        entered = time.monotonic_ns()
        time.sleep(body_seconds)
        left = time.monotonic_ns()
        coordinator.release(admitted, "success")
        records.append((entered, left, admitted.holds[0].token or 0))
    return records


def test_lock_excludes_across_processes_and_fencing_tokens_increase(url: str, prefix: str) -> None:
    workers, rounds = 4, 25
    results = run_processes(
        lock_rounds, [(url, prefix, w, rounds, "shared", 0.002) for w in range(workers)]
    )
    records = sorted(r for worker in results for r in worker)
    assert len(records) == workers * rounds
    assert overlapping([(entered, left) for entered, left, _ in records]) == []
    tokens = [token for _, _, token in records]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    # strictly increasing: one fresh token per acquisition; the fence names the last one
    assert (
        state.lock_state("shared", client=get_client(url), prefix=prefix).last_token == tokens[-1]
    )


def test_locks_on_different_keys_overlap(url: str, prefix: str) -> None:
    # bodies long enough to overlap however late a loaded machine starts the second process
    results = run_processes(lock_rounds, [(url, prefix, w, 1, f"key-{w}", 2.0) for w in range(2)])
    (first,), (second,) = results
    assert overlapping([first[:2], second[:2]]) != []


def long_holder(url: str, prefix: str, ttl: float, body: float, ready: Any) -> dict[str, Any]:
    coordinator = child_coordinator(url, prefix)
    admitted = coordinator.admit([LockClaim("long", ttl=ttl)], holder("long"))
    assert isinstance(admitted, Admitted)
    with Renewal(admitted, coordinator=coordinator) as renewal:
        entered = time.monotonic_ns()
        ready.set()
        time.sleep(body)
        left = time.monotonic_ns()
    coordinator.release(admitted, "success")
    return {
        "interval": (entered, left),
        "renewals": renewal.renewals,
        "lost": renewal.lost is not None,
    }


def test_a_body_three_times_the_ttl_stays_exclusive_with_renewal(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    ttl, body = KEPT_LEASE, 3 * KEPT_LEASE
    ready = FORK.Event()
    outcome: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: outcome.update(
            run_processes(long_holder, [(url, prefix, ttl, body, ready)])[0]
        )
    )
    runner.start()
    assert ready.wait(10)
    contender = coordinator.admit_waiting([LockClaim("long", ttl=ttl)], holder("contender"), 15)
    entered = time.monotonic_ns()
    assert isinstance(contender, Admitted)
    coordinator.release(contender, "success")
    runner.join(20)
    assert outcome["lost"] is False and outcome["renewals"] >= 3
    holder_left = outcome["interval"][1]
    assert entered >= holder_left  # the contender got in only after the long body ended


class SlowRenewals(Coordinator):
    """A coordinator whose renewal round trips take ``delay`` seconds: a Redis that answers
    slowly (or a connection timing out), for the renewals of this coordinator only."""

    def __init__(self, *args: Any, delay: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.renewing = threading.Event()

    def extend_many(self, *args: Any, **kwargs: Any) -> Any:
        self.renewing.set()
        time.sleep(self.delay)
        return super().extend_many(*args, **kwargs)


def test_a_renewal_round_stuck_on_a_slow_redis_holds_up_no_other_holds_release(
    prefix: str,
) -> None:
    """The process has one renewal thread; ``stop()`` waits for a round only when that round
    is renewing its own holds. Waiting for any round would hold every gate's exit in the
    process hostage to one slow client (up to the connect or command timeout)."""
    client = get_client(redis_url())
    slow = SlowRenewals(client=client, prefix=prefix, delay=2.0)
    quick = Coordinator(client=client, prefix=prefix)
    stuck = slow.admit([LockClaim("slow", ttl=0.6)], holder("slow"))  # renewed every 0.2 s
    other = quick.admit([LockClaim("other", ttl=60)], holder("other"))  # not due for 20 s
    assert isinstance(stuck, Admitted) and isinstance(other, Admitted)
    try:
        with Renewal(stuck, coordinator=slow):
            assert slow.renewing.wait(5)  # its round is out, waiting on the slow answer
            renewal = Renewal(other, coordinator=quick).start()
            started = time.monotonic()
            renewal.stop()
            took = time.monotonic() - started
    finally:
        quick.release(other, "success")
        quick.release(stuck, "success")
    assert took < 1.5, took  # never the stuck round's 2 s


def test_a_renewal_due_with_a_stuck_one_stops_without_waiting_for_its_client(
    prefix: str,
) -> None:
    """Renewals due together share a round, one pipeline per client and prefix. One whose
    pipeline has not gone out yet (another client's is stuck before it) stops at once: that
    part of the round skips it."""
    client = get_client(redis_url())
    slow = SlowRenewals(client=client, prefix=prefix, delay=2.0)
    quick = Coordinator(client=client, prefix=f"{prefix}:other")
    first = slow.admit([LockClaim("slow", ttl=0.6)], holder("slow"))
    second = quick.admit([LockClaim("other", ttl=0.6)], holder("other"))  # due with it
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    stuck = Renewal(first, coordinator=slow).start()
    renewal = Renewal(second, coordinator=quick).start()
    try:
        assert slow.renewing.wait(5)  # the round is out, stuck on the slow answer
        started = time.monotonic()
        renewal.stop()
        took = time.monotonic() - started
    finally:
        stuck.stop()
        quick.release(second, "success")
        slow.release(first, "success")
    assert took < 1.5, took  # never the stuck round's 2 s


#: the restarted renewal's lease, and its renewal round (a third of it)
LEASE = 1.5
ROUND = LEASE / 3


def test_a_stopped_renewal_is_let_go_at_once_and_a_restarted_one_renewed_once(
    prefix: str,
) -> None:
    """The scheduler forgets a stopped renewal when it stops, not when its (cleared) heap
    entry reaches the top a third of a lease later: until then the entry would keep the
    renewal, its callbacks and everything they reach alive (on a busy process, every recent
    call's objects). A renewal stopped and restarted (``Gate.exit_unless``) has one live entry,
    so it is renewed once per round, not once per start."""
    coordinator = Coordinator(client=get_client(redis_url()), prefix=prefix)
    admitted = coordinator.admit([LockClaim("let-go", ttl=60)], holder("let-go"))
    again = coordinator.admit([LockClaim("restarted", ttl=LEASE)], holder("restarted"))
    assert isinstance(admitted, Admitted) and isinstance(again, Admitted)
    try:
        renewal = Renewal(admitted, coordinator=coordinator).start()  # due in 20 s
        gone = weakref.ref(renewal)
        renewal.stop()
        del renewal
        gc.collect()
        assert gone() is None

        extended: list[str] = []
        restarted = Renewal(
            again, coordinator=coordinator, on_extended=lambda k, _: extended.append(k)
        )
        restarted.start()
        restarted.stop()
        restarted.restart()
        started = time.monotonic()
        # a round every third of the lease: wait for the first (a loaded machine may take
        # longer), then about one more; one live entry renews once per round, two would
        # renew twice. The lease is long enough that a round late on a loaded machine (the
        # scheduler thread shares two cores with the rest of the suite) does not lose it.
        while restarted.renewals < 1 and time.monotonic() < started + 10:
            time.sleep(0.02)
        time.sleep(ROUND * 1.5)
        restarted.stop()
        elapsed = time.monotonic() - started
        rounds = restarted.renewals
    finally:
        coordinator.release(again, "success")
        coordinator.release(admitted, "success")
    assert 1 <= rounds <= elapsed / ROUND + 1 and len(extended) == rounds, (rounds, elapsed)


def test_a_renewal_stopped_but_never_removed_is_let_go_at_its_next_round(prefix: str) -> None:
    """An exception can land between a renewal's ``stopped`` and its removal from the
    scheduler (Celery's soft limit, raised by a signal handler as ``remove`` is called): the
    scheduler renews it no more, no longer counts it, and lets go of it when it comes due,
    instead of carrying it — its callbacks, its gate — for the life of the process."""
    coordinator = Coordinator(client=get_client(redis_url()), prefix=prefix)
    admitted = coordinator.admit([LockClaim("half-stopped", ttl=LEASE)], holder("half-stopped"))
    assert isinstance(admitted, Admitted)
    try:
        renewal = Renewal(admitted, coordinator=coordinator).start()
        assert any(r is renewal for r in scheduler().renewing())
        renewal.stopped = True  # stop() cut off before it called remove()
        assert not any(r is renewal for r in scheduler().renewing())
        gone = weakref.ref(renewal)
        del renewal
        deadline = time.monotonic() + 10 * ROUND
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
            gc.collect()
        assert gone() is None, "still held by the scheduler"
    finally:
        coordinator.release(admitted, "success")


def test_a_renewal_stopped_and_restarted_during_its_round_is_renewed_once_per_round(
    prefix: str,
) -> None:
    """``Gate.exit_unless`` stops a renewal and, when the release is refused (a cancel
    request), restarts it. When that happens while the renewal is out of the heap for a round
    (its part not begun: another client's pipeline is stuck first), the round must not put it
    back beside the entry the restart pushed: it would be renewed twice per round for good, and
    the old entry would keep the renewal alive after its stop."""
    client = get_client(redis_url())
    slow = SlowRenewals(client=client, prefix=prefix, delay=0.3)
    quick = Coordinator(client=client, prefix=f"{prefix}:other")
    # leases long enough that the slow client's 0.3 s in a round, plus a stall of a loaded
    # machine, leaves the quick one a second of margin
    first = slow.admit([LockClaim("slow", ttl=2.0)], holder("slow"))
    second = quick.admit([LockClaim("other", ttl=2.0)], holder("other"))  # due with it
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    extended: list[str] = []
    stuck = Renewal(first, coordinator=slow).start()
    renewal = Renewal(second, coordinator=quick, on_extended=lambda k, _: extended.append(k))
    renewal.start()
    try:
        assert slow.renewing.wait(5)  # the round is out, stuck before the quick client's part
        renewal.stop()
        renewal.restart()
        stuck.stop()  # the slow client's round ends within its delay; no more after it
        started = time.monotonic()
        time.sleep(3.0)  # the quick renewal alone: every 2/3 s
        renewal.stop()
        elapsed = time.monotonic() - started
        rounds = len(extended)
        entries = [e for e in scheduler()._heap if e[2] is renewal]
    finally:
        quick.release(second, "success")
        slow.release(first, "success")
    assert entries == []  # stopped: nothing in the heap keeps it
    # about 3.0 / (2/3) rounds, each renewing it once (twice each with a second live entry)
    assert 2 <= rounds <= elapsed / (2.0 / 3) + 2, (rounds, elapsed, extended)
    assert renewal.lost is None


@pytest.mark.parametrize("alone", [True, False], ids=["lock-alone", "lock-with-semaphore"])
def test_a_stale_release_never_frees_the_hold_its_owner_took_again(
    prefix: str, alone: bool
) -> None:
    """A delivery that lost its execution claim mid-step is replaced by one that drops the
    stale holds (a force-release) and takes them again under the same owner — the execution —
    with a new fencing token. When the stale delivery reaches its exit, its release must not
    free the new hold while the new delivery's step runs under it. Both release scripts (the
    lone-lock one and the general one) check the admission's token."""
    coordinator = Coordinator(client=get_client(redis_url()), prefix=prefix)
    owner = Holder(owner="root-execution")
    claims: list[Claim] = [LockClaim("acct:9", ttl=30)]
    if not alone:
        claims.append(SemaphoreClaim("pool:9", limit=2))
    stale = coordinator.admit(claims, owner)
    assert isinstance(stale, Admitted)
    coordinator.force_release("lock", "acct:9", owner="root-execution")
    taken_again = coordinator.admit([LockClaim("acct:9", ttl=30)], owner)
    assert isinstance(taken_again, Admitted)
    assert taken_again.holds[0].token != stale.holds[0].token
    released = coordinator.release(stale, "park")
    assert ("lock", "acct:9") in released.not_held and ("lock", "acct:9") not in released.freed
    current = state.lock_state("acct:9", client=coordinator.client, prefix=prefix)
    assert current.held and current.token == taken_again.holds[0].token
    assert current.owner == "root-execution"
    listed = holds_index.page(key="acct:9", client=coordinator.client, prefix=prefix).rows
    assert [row["owner"] for row in listed] == ["root-execution"]  # its index entry stays
    assert coordinator.release(taken_again, "success").freed == [("lock", "acct:9")]


def test_a_stale_release_or_renewal_never_touches_the_semaphore_slot_its_owner_took_again(
    prefix: str,
) -> None:
    """The semaphore side of the takeover above: the stale delivery's slot is force-released
    and the new delivery takes one under the same owner. The stale delivery's release must not
    give that new slot back (a third owner would then run beside the new delivery, past the
    limit), and its renewal must report the slot lost instead of renewing the new one."""
    coordinator = Coordinator(client=get_client(redis_url()), prefix=prefix)
    owner = Holder(owner="root-execution")
    pool = SemaphoreClaim("pool:10", limit=1, ttl=30)
    stale = coordinator.admit([pool], owner)
    assert isinstance(stale, Admitted)
    coordinator.force_release("semaphore", "pool:10", owner="root-execution")
    taken_again = coordinator.admit([pool], owner)
    assert isinstance(taken_again, Admitted) and taken_again.holds[0].fresh

    renewed = coordinator.extend(stale.holds, "root-execution")
    assert [reason for _, reason in renewed.lost] == ["token"] and not renewed.extended
    released = coordinator.release(stale, "success")
    assert ("semaphore", "pool:10") in released.not_held
    assert ("semaphore", "pool:10") not in released.freed
    # the slot is still the new delivery's: the limit of 1 holds
    third = coordinator.admit([pool], Holder(owner="another-execution"))
    assert isinstance(third, Refused), third
    listed = holds_index.page(key="pool:10", client=coordinator.client, prefix=prefix).rows
    assert [row["owner"] for row in listed] == ["root-execution"]  # its index entry stays
    assert coordinator.extend(taken_again.holds, "root-execution").lost == []
    assert coordinator.release(taken_again, "success").freed == [("semaphore", "pool:10")]
    assert isinstance(coordinator.admit([pool], Holder(owner="another-execution")), Admitted)


def hold_then_sleep(url: str, prefix: str, claims: list[Claim], ready: Any) -> None:
    coordinator = child_coordinator(url, prefix)
    admitted = coordinator.admit(claims, holder(f"doomed-{os.getpid()}"))
    assert isinstance(admitted, Admitted)
    Renewal(admitted, coordinator=coordinator).start()  # killed with the process
    ready.set()
    time.sleep(60)


def kill_holder(url: str, prefix: str, claims: list[Claim]) -> float:
    """Start a process holding ``claims``, SIGKILL it; return the monotonic time of the kill."""
    ready = FORK.Event()
    process = FORK.Process(target=hold_then_sleep, args=(url, prefix, claims, ready))
    process.start()
    assert ready.wait(10)
    os.kill(process.pid or 0, signal.SIGKILL)
    killed_at = time.monotonic()
    process.join(5)
    assert process.exitcode == -signal.SIGKILL
    return killed_at


def test_a_killed_lock_holder_frees_the_key_when_its_ttl_lapses(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    ttl = 2.0
    killed_at = kill_holder(url, prefix, [LockClaim("crash", ttl=ttl)])
    assert state.lock_state("crash", client=coordinator.client).held
    admitted = coordinator.admit_waiting([LockClaim("crash")], holder("next"), 8)
    waited = time.monotonic() - killed_at
    assert isinstance(admitted, Admitted)
    # Renewed every ttl/3 until the kill, so between 2/3 and all of a TTL was left; the upper
    # bound leaves room for a loaded 2-core machine but stays far below the 8 s wait.
    assert 0.8 * ttl / 2 < waited < ttl + 1.5, waited
    coordinator.release(admitted, "success")


def test_a_lock_refused_in_its_last_millisecond_still_says_when_to_retry(
    coordinator: Coordinator,
) -> None:
    # Regression (CI, embedded): a waiter retries exactly when the holder's lease ends, so its
    # admission can run in the hold's last millisecond, when Redis still has the key but PTTL
    # answers 0. That refusal said "no retry_after" and the waiter slept out its whole wait
    # (8 s) on a key that had lapsed. Leases of 1 ms put every refusal near that edge.
    refusals = []
    for attempt in range(400):
        held = coordinator.admit([LockClaim(f"edge:{attempt}", ttl=0.001)], holder("brief"))
        assert isinstance(held, Admitted)
        answer = coordinator.admit([LockClaim(f"edge:{attempt}")], holder("next"))
        if isinstance(answer, Refused):
            refusals.append(answer.retry_after)
    assert refusals, "no admission came while the 1 ms lease was held"
    assert all(retry is not None and retry > 0 for retry in refusals), refusals


def test_a_wait_reports_the_waiters_its_first_refusal_granted(
    coordinator: Coordinator,
) -> None:
    # Review finding: the caller's own first admission may grant free semaphore slots to the
    # heads of the line while refusing the caller (its ``woken``); a wait that went on from
    # that refusal reported only its own attempts' grants, so a granted parked head was never
    # re-enqueued and its grant lapsed unused.
    claim = LockClaim("wake-report", ttl=30)
    assert isinstance(coordinator.admit([claim], holder("first")), Admitted)
    refused = coordinator.admit([claim], holder("second"))
    assert isinstance(refused, Refused)
    refused.woken = ["parked-head"]
    answer = coordinator.admit_waiting([claim], holder("second"), 0.3, refused=refused)
    assert isinstance(answer, Refused)
    assert answer.woken == ["parked-head"]


#: seconds: a wait that came back sooner was woken by the release (the only other ends are a
#: 10 s wait and a 30 s lease); generous, as a loaded machine can stall a thread for a while
WOKEN_WITHIN = 2.0


def test_admit_waiting_is_woken_by_the_release(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    claim = LockClaim("wake", ttl=30)
    held = coordinator.admit([claim], holder("first"))
    assert isinstance(held, Admitted)
    entered: dict[str, Any] = {}

    def waiter() -> None:
        result = coordinator.admit_waiting([claim], holder("second"), 10)
        entered["at"] = time.monotonic()
        entered["result"] = result

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # the waiter is refused (retry_after ≈ 30 s) and sleeps on pub/sub
    released_at = time.monotonic()
    coordinator.release(held, "success")
    thread.join(10)
    assert isinstance(entered["result"], Admitted)
    latency = entered["at"] - released_at
    print(f"woken {latency * 1000:.2f} ms after the release")
    # woken by the release: nothing else could end the wait before the 10 s wait or the 30 s
    # lease (no polling). How fast is bench/wake_latency.py's question, not a test's.
    assert latency < WOKEN_WITHIN, latency
    coordinator.release(entered["result"], "success")


def test_a_thread_that_waits_again_reuses_its_wake_subscription(private_redis: Any) -> None:
    """Closing a wait's PubSub disconnects a pooled connection (redis-py), so the next command
    reconnects: a thread keeps its subscription instead (``coordination.subscriptions``).
    Consecutive waits on the same key and on another one are each woken by their release."""
    coordinator = Coordinator(client=private_redis, prefix="subs")
    keys = "aabbaabbab"
    go = [threading.Event() for _ in keys]
    woken: list[tuple[float, Any]] = []

    def waiter() -> None:
        for round_, key in enumerate(keys):
            go[round_].wait(10)
            result = coordinator.admit_waiting([LockClaim(key, ttl=30)], holder(f"w{round_}"), 10)
            at = time.monotonic()
            if isinstance(result, Admitted):
                coordinator.release(result, "success")
            woken.append((at, result))  # released first: the next round may take the key

    thread = threading.Thread(target=waiter)
    thread.start()
    connections: list[int] = []
    latencies = []
    try:
        for round_, key in enumerate(keys):
            held = coordinator.admit([LockClaim(key, ttl=30)], holder(f"h{round_}"))
            assert isinstance(held, Admitted)
            go[round_].set()
            time.sleep(0.2)  # the waiter is refused and sleeps on its subscription
            released_at = time.monotonic()
            coordinator.release(held, "success")
            deadline = time.monotonic() + 10
            while len(woken) <= round_ and time.monotonic() < deadline:
                time.sleep(0.005)
            assert len(woken) == round_ + 1, f"round {round_}: the waiter never came back"
            at, result = woken[round_]
            assert isinstance(result, Admitted), (round_, result)
            latencies.append(at - released_at)
            connections.append(int(private_redis.info("stats")["total_connections_received"]))
    finally:
        for event in go:
            event.set()
        thread.join(10)
    # every wait was woken by its release (a 30 s lease, a 10 s wait otherwise)
    assert max(latencies) < WOKEN_WITHIN, latencies
    # The first round opened what the two threads need (pool connections, one subscription).
    # Closing each wait's subscription made every later round reconnect (9 more here); a
    # later round may still open one when both threads happen to need the pool at once.
    assert connections[-1] - connections[0] <= 3, str(connections)


def test_a_forked_child_never_reuses_its_parents_wake_subscription(prefix: str) -> None:
    global _FORK_CLIENT
    coordinator = Coordinator(client=get_client(redis_url()), prefix=prefix)
    claim = LockClaim("fork-sub", ttl=30)
    held = coordinator.admit([claim], holder("first"))
    assert isinstance(held, Admitted)
    threading.Timer(0.2, coordinator.release, (held, "success")).start()
    admitted = coordinator.admit_waiting([claim], holder("second"), 10)
    assert isinstance(admitted, Admitted)
    coordinator.release(admitted, "success")
    kept = subscriptions.borrow(coordinator.client)  # what this thread kept from its wait
    subscriptions.give_back(kept, coordinator.client, [], reusable=True)
    _FORK_CLIENT = coordinator.client  # the very client object, inherited by the child
    with multiprocessing.get_context("fork").Pool(1) as pool:
        # its socket is the parent's: a child reading it would steal the parent's messages
        child_got_the_parents = pool.apply(_borrows_the_kept_subscription, (id(kept),))
    assert child_got_the_parents is False
    assert subscriptions.borrow(coordinator.client) is kept  # the parent's is still its own


_FORK_CLIENT: Any = None


def test_a_child_forked_while_a_client_was_being_built_can_build_its_own() -> None:
    """The guard around building a client is held while a cluster client maps its slots over
    the network; a fork at that moment (a prefork worker pool) must not leave the child's
    copy of it locked forever."""
    from reactor_app.coordination import redis as coordination_redis

    guard = coordination_redis._clients_guard
    assert guard.acquire(timeout=10)  # as a thread building a client would hold it
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            pending = pool.apply_async(_pings_a_fresh_client, (redis_url(),))
            answered = pending.get(timeout=20)
    finally:
        guard.release()
    assert answered is True


def _pings_a_fresh_client(url: str) -> bool:
    return bool(get_client(url).ping())


def _borrows_the_kept_subscription(kept_id: int) -> bool:
    return id(subscriptions.borrow(_FORK_CLIENT)) == kept_id


# -- semaphore --------------------------------------------------------------------------------


def semaphore_rounds(url: str, prefix: str, worker: int, rounds: int, limit: int) -> list[Interval]:
    coordinator = child_coordinator(url, prefix)
    records = []
    for round_ in range(rounds):
        admitted = coordinator.admit_waiting(
            [SemaphoreClaim("pool", limit=limit, ttl=10)], holder(f"w{worker}-{round_}"), 30
        )
        assert isinstance(admitted, Admitted), admitted
        entered = time.monotonic_ns()
        time.sleep(0.02)
        left = time.monotonic_ns()
        coordinator.release(admitted, "success")
        records.append((entered, left))
    return records


def test_semaphore_concurrency_reaches_but_never_exceeds_the_limit(url: str, prefix: str) -> None:
    limit = 3
    results = run_processes(semaphore_rounds, [(url, prefix, w, 8, limit) for w in range(6)])
    intervals = [interval for worker in results for interval in worker]
    assert len(intervals) == 48
    assert peak_concurrency(intervals) == limit


def test_a_killed_semaphore_holder_returns_its_slot_after_the_lease(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    lease = 2.0  # renewed every 2/3 s until the kill: a stalled holder keeps it regardless
    killed_at = kill_holder(url, prefix, [SemaphoreClaim("slots", limit=1, ttl=lease)])
    claim = SemaphoreClaim("slots", limit=1, ttl=lease)
    assert isinstance(coordinator.admit([claim], holder("next")), Refused)
    admitted = coordinator.admit_waiting([claim], holder("next"), 8)
    waited = time.monotonic() - killed_at
    assert isinstance(admitted, Admitted)
    # between 2/3 and all of a lease was left at the kill; the upper bound allows a late wake
    assert 0.8 * lease / 2 < waited < lease + 1.5, waited


def test_a_semaphore_limit_change_applies_at_once(coordinator: Coordinator) -> None:
    first = coordinator.admit([SemaphoreClaim("elastic", limit=1)], holder("a"))
    assert isinstance(first, Admitted)
    assert isinstance(coordinator.admit([SemaphoreClaim("elastic", limit=1)], holder("b")), Refused)
    second = coordinator.admit([SemaphoreClaim("elastic", limit=2)], holder("b"))
    assert isinstance(second, Admitted)
    # and lowered: two are inside, so a limit of 2 (or 1) refuses a third at once
    for limit in (2, 1):
        refused = coordinator.admit([SemaphoreClaim("elastic", limit=limit)], holder("c"))
        assert isinstance(refused, Refused) and refused.detail.held == 2


# -- rate limit -------------------------------------------------------------------------------


def rate_burst(
    url: str, prefix: str, worker: int, windows: tuple[RateWindow, ...], seconds: float
) -> list[int]:
    """Take the rate limit as fast as it allows for ``seconds``; admission times in Redis µs."""
    coordinator = child_coordinator(url, prefix)
    claim = RateLimitClaim("burst", windows)
    admitted_at = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        result = coordinator.admit_waiting([claim], holder(f"w{worker}"), stop - time.monotonic())
        if isinstance(result, Admitted):
            admitted_at.append(redis_micros(result.holds[0]))
    return admitted_at


def assert_no_window_exceeds(times_us: list[int], window: RateWindow) -> None:
    """In sorted admissions, any ``limit + 1`` of them span at least the window."""
    ordered = sorted(times_us)
    window_us = round(window.seconds * 1_000_000)
    for first, last in zip(ordered, ordered[window.limit :], strict=False):
        assert last - first >= window_us, (window, first, last)


def test_no_sliding_window_ever_admits_more_than_the_limit(url: str, prefix: str) -> None:
    window = RateWindow(seconds=0.25, limit=5, label="0.25")
    results = run_processes(rate_burst, [(url, prefix, w, (window,), 1.5) for w in range(4)])
    admissions = [t for worker in results for t in worker]
    assert_no_window_exceeds(admissions, window)
    # and the limit is actually used, not starved: about 5 per 0.25 s over 1.5 s, 30 in all
    # (at least half of them: a stall of a loaded machine costs a whole window's five)
    assert len(admissions) >= 15, len(admissions)


def test_two_windows_are_checked_and_charged_together(url: str, prefix: str) -> None:
    windows = rate_limit.windows_from(limits={0.2: 3, 1: 5})
    results = run_processes(rate_burst, [(url, prefix, w, windows, 2.5) for w in range(3)])
    admissions = [t for worker in results for t in worker]
    for window in windows:
        assert_no_window_exceeds(admissions, window)
    # the 1 s window is the binding one: 5 in the first second, more after it slides (at
    # most 5 in any second: 15 in 2.5 s)
    assert 6 <= len(admissions) <= 15, len(admissions)


def test_rate_limit_retry_after_is_exact_to_the_window_edge(coordinator: Coordinator) -> None:
    window = RateWindow(seconds=1.0, limit=3, label="second")
    claim = RateLimitClaim("exact", (window,))
    firsts = []
    for n in range(3):
        admitted = coordinator.admit([claim], holder(f"h{n}"))
        assert isinstance(admitted, Admitted)
        firsts.append(redis_micros(admitted.holds[0]))
        time.sleep(0.05)
    refused = coordinator.admit([claim], holder("late"))
    assert isinstance(refused, Refused) and refused.retry_after is not None
    seconds, micros = refused.detail.time.split(".")
    refused_at = int(seconds) * 1_000_000 + int(micros)
    expected = (firsts[0] + 1_000_000 - refused_at) / 1_000_000
    assert abs(refused.retry_after - expected) < 0.002, (refused.retry_after, expected)

    # refused until the edge, by Redis's clock; admitted from it
    probe_across_edge(coordinator, claim, firsts[0] + 1_000_000, "probe")


# -- period -------------------------------------------------------------------------------------


def period_racer(url: str, prefix: str, worker: int) -> str:
    coordinator = child_coordinator(url, prefix)
    claims: list[Claim] = [PeriodClaim("nightly", "day"), LockClaim("nightly", ttl=10)]
    result = coordinator.admit_waiting(claims, holder(f"w{worker}"), 20)
    if isinstance(result, PeriodHit):
        return "skipped"
    assert isinstance(result, Admitted), result
    time.sleep(0.05)
    coordinator.release(result, "success")
    return "ran"


def test_period_runs_once_per_bucket_among_concurrent_processes(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    outcomes = run_processes(period_racer, [(url, prefix, w) for w in range(5)])
    assert sorted(outcomes) == ["ran"] + ["skipped"] * 4
    assert state.period_marked("nightly", "day", client=coordinator.client)


# -- ordered lock ------------------------------------------------------------------------------


def ordered_turn(
    url: str, prefix: str, position: OrderedPosition, start_delay: float
) -> tuple[int, int, int]:
    coordinator = child_coordinator(url, prefix)
    time.sleep(start_delay)
    claim = OrderedLockClaim("line", position, poison_pill_timeout=30)
    admitted = coordinator.admit_waiting([claim], holder(f"n{position.nonce}"), 30)
    assert isinstance(admitted, Admitted), admitted
    entered = time.monotonic_ns()
    time.sleep(0.01)
    left = time.monotonic_ns()
    coordinator.release(admitted, "success")
    return entered, left, position.nonce


def test_ordered_lock_passes_concurrent_holders_in_nonce_order(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    positions = [coordinator.assign_position("line", holder(f"n{n}")) for n in range(6)]
    # started in reverse order, so arrival order at Redis is not the nonce order
    args = [(url, prefix, p, 0.03 * (5 - i)) for i, p in enumerate(positions)]
    turns = sorted(run_processes(ordered_turn, args))
    assert [nonce for _, _, nonce in turns] == [p.nonce for p in positions]
    assert overlapping([(entered, left) for entered, left, _ in turns]) == []


def test_a_dead_ordered_head_is_passed_over_after_the_poison_pill_timeout(
    url: str, prefix: str, coordinator: Coordinator
) -> None:
    timeout = 2.0  # heartbeats every 2/3 s until the kill: a stalled head is not passed over
    dead = coordinator.assign_position("dead-line", holder("dead"))
    alive = coordinator.assign_position("dead-line", holder("alive"))
    head = OrderedLockClaim("dead-line", dead, poison_pill_timeout=timeout)
    # the head is admitted and heartbeats from its renewal thread, then is killed mid-run
    killed_at = kill_holder(url, prefix, [head])
    claim = OrderedLockClaim("dead-line", alive, poison_pill_timeout=timeout)
    refused = coordinator.admit([claim], holder("alive"))
    assert isinstance(refused, Refused) and refused.detail.head == dead.nonce
    admitted = coordinator.admit_waiting([claim], holder("alive"), 8)
    waited = time.monotonic() - killed_at
    assert isinstance(admitted, Admitted)
    # last heartbeat was at most timeout/3 before the kill; the upper bound allows a late wake
    assert 0.8 * timeout / 2 < waited < timeout + 1.5, waited
    line = state.ordered_state("dead-line", client=coordinator.client)
    assert (line.last_completed, line.in_flight) == (1, alive.nonce)


# -- one round trip -----------------------------------------------------------------------------


def test_five_primitives_cost_one_script_call_to_admit_and_one_to_release(
    private_redis: Any,
) -> None:
    coordinator = Coordinator(client=private_redis, prefix="stats")
    position = coordinator.assign_position("acct:1", holder("h"))

    def claims() -> list[Claim]:
        windows = rate_limit.windows_from(limits={"second": 100, "hour": 1000})
        return [
            OrderedLockClaim("acct:1", position),
            PeriodClaim("acct:1", 3600),
            LockClaim("acct:1"),
            SemaphoreClaim("acct:1", limit=2),
            RateLimitClaim("acct:1", windows),
        ]

    warm = coordinator.admit(claims(), holder("h"))  # loads the scripts (SCRIPT LOAD once)
    assert isinstance(warm, Admitted)
    coordinator.release(warm, "retry")

    # client side: every request on a connection goes through send_packed_command (the
    # scripts' own fast path too, which skips execute_command)
    sent: list[str] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counting(connection: Any, command: Any, *args: Any, **options: Any) -> Any:
        for request in [command] if isinstance(command, (bytes, str)) else command:
            head = request if isinstance(request, bytes) else str(request).encode()
            if head.startswith(b"*"):  # a request's first chunk: "*<n>\r\n$<len>\r\nNAME"
                sent.append(head.split(b"\r\n")[2].decode())
        return send(connection, command, *args, **options)

    redis.connection.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        before = command_calls(private_redis)
        sent.clear()
        admitted = coordinator.admit(claims(), holder("h"))
        admit_sent = list(sent)
        after_admit = command_calls(private_redis)
        sent.clear()
        assert isinstance(admitted, Admitted) and len(admitted.holds) == 5
        coordinator.release(admitted, "success")
        release_sent = list(sent)
        after_release = command_calls(private_redis)
    finally:
        redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]

    def evalsha(a: dict[str, int], b: dict[str, int]) -> int:
        return b.get("cmdstat_evalsha", 0) - a.get("cmdstat_evalsha", 0)

    # server side: Redis executed exactly one EVALSHA for each (INFO itself excluded)
    assert evalsha(before, after_admit) == 1
    assert evalsha(after_admit, after_release) == 1
    assert after_release.get("cmdstat_eval", 0) == before.get("cmdstat_eval", 0)
    assert admit_sent == ["EVALSHA"] and release_sent == ["EVALSHA"]


def test_a_single_lock_takes_the_fast_path_and_keeps_the_general_scripts_rules(
    coordinator: Coordinator,
) -> None:
    """One lock alone goes through ``lock_admit.lua`` / ``lock_release.lua``; a lock among
    other claims through ``admit.lua`` / ``release.lua``. Both must answer alike: the same
    sequence — take, re-enter, refuse with a registered waiter, FIFO grant on release, refuse a
    newcomer during the grant, admit the granted waiter — is played through each."""

    def play(general: bool) -> list[Any]:
        key = f"parity:{'general' if general else 'fast'}"
        # a rate limit beside the lock sends it through the general scripts
        extra = [RateLimitClaim(key, rate_limit.windows_from(limits={"hour": 10**6}))]
        claims = [LockClaim(key, ttl=30), *extra] if general else [LockClaim(key, ttl=30)]
        seen: list[Any] = []

        def admit(owner: str, waiter: str | None = None) -> Any:
            result = coordinator.admit(claims, holder(owner), waiter_id=waiter)
            if isinstance(result, Admitted):
                lock_hold = result.holds[0]
                seen.append(("admitted", owner, lock_hold.fresh, lock_hold.token is not None))
            else:
                assert isinstance(result, Refused)
                blocker = result.blocker or {}
                seen.append(
                    ("refused", owner, blocker.get("owner"), result.retry_after is not None)
                )
            return result

        first = admit("a")
        again = admit("a")
        assert isinstance(first, Admitted) and isinstance(again, Admitted)
        assert first.holds[0].token == again.holds[0].token  # re-entry keeps the token
        admit("b", waiter="w-b")
        assert coordinator.waiters(LockClaim(key)) == ["w-b"]
        inner = coordinator.release(again, "success")
        seen.append(("released", inner.freed, inner.woken, inner.not_held))
        outer = coordinator.release(first, "success")
        seen.append(("released", outer.freed, outer.woken, outer.not_held))
        admit("c")  # the freed key is granted to w-b: a newcomer is refused meanwhile
        granted = admit("b", waiter="w-b")
        assert isinstance(granted, Admitted)
        assert granted.holds[0].token > first.holds[0].token  # fencing tokens only grow
        gone = coordinator.release(first, "success")  # not a's any more
        seen.append(("released", gone.freed, gone.woken, gone.not_held))
        coordinator.release(granted, "success")
        return [
            tuple(k.replace(key, "K") if isinstance(k, str) else k for k in entry)
            if entry[0] != "released"
            else (
                "released",
                [(p, k.replace(key, "K")) for p, k in entry[1] if p == "lock"],
                entry[2],
                [(p, k.replace(key, "K")) for p, k in entry[3] if p == "lock"],
            )
            for entry in seen
        ]

    scripts = scripts_for(coordinator.client)
    used: list[str] = []

    def recording(method: Any) -> Any:
        def record(operation: str, *args: Any, **options: Any) -> Any:
            used.append(operation)
            return method(operation, *args, **options)

        return record

    scripts.call = recording(scripts.call)  # type: ignore[method-assign]
    scripts.run = recording(scripts.run)  # type: ignore[method-assign]
    try:
        fast = play(general=False)
        fast_scripts, used[:] = set(used), []
        general = play(general=True)
        general_scripts = set(used)
    finally:
        del scripts.call, scripts.run
    assert fast_scripts == {"lock_admit", "lock_release"}
    assert general_scripts == {"admit", "release"}
    assert fast == general
    assert fast == [
        ("admitted", "a", True, True),
        ("admitted", "a", False, True),
        ("refused", "b", "a", True),
        ("released", [], [], []),
        ("released", [("lock", "K")], ["w-b"], []),
        ("refused", "c", None, True),  # blocked by the grant, not by a holder
        ("admitted", "b", True, True),
        ("released", [], [], [("lock", "K")]),
    ]
