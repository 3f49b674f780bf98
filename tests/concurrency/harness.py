"""Shared harness for concurrency tests: fork worker processes, record and compare intervals.

Intervals are ``(label, start_ns, end_ns)`` taken with ``time.time_ns()`` on one machine, so
they are comparable across processes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from typing import Any

from django.db import connections

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    Admitted,
    Claim,
    Holder,
    LockClaim,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.replies import TrackedHold

Interval = tuple[str, int, int]


def now_ns() -> int:
    return time.time_ns()


def overlaps(intervals: Iterable[Interval]) -> list[tuple[Interval, Interval]]:
    """Every pair of intervals that overlap in time (touching ends do not count)."""
    ordered = sorted(intervals, key=lambda i: i[1])
    found = []
    for index, current in enumerate(ordered):
        for other in ordered[index + 1 :]:
            if other[1] >= current[2]:
                break
            found.append((current, other))
    return found


def max_concurrency(intervals: Iterable[Interval]) -> int:
    points = []
    for _, start, end in intervals:
        points.append((start, 1))
        points.append((end, -1))
    # At equal times, exits first: touching intervals are not concurrent.
    points.sort(key=lambda p: (p[0], p[1]))
    level = peak = 0
    for _, delta in points:
        level += delta
        peak = max(peak, level)
    return peak


def _child(target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    # Forked children must not share the parent's database connection.
    connections.close_all()
    try:
        return target(*args)
    finally:
        connections.close_all()


def run_in_processes(target: Callable[..., Any], arg_list: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*args)`` in one forked process per entry; return their return values.

    The connections are closed first, and so is a connection pool (``OPTIONS["pool"]``,
    Django 5.1+): a pool's sockets and worker threads do not survive a fork, and a child
    waited for them until the test's timeout."""
    connections.close_all()
    for alias in connections:
        close_pool = getattr(connections[alias], "close_pool", None)
        if close_pool is not None:
            close_pool()
    context = multiprocessing.get_context("fork")
    with context.Pool(len(arg_list)) as pool:
        results = [pool.apply_async(_child, (target, args)) for args in arg_list]
        return [r.get(timeout=300) for r in results]


@contextlib.contextmanager
def held_elsewhere(key: str, ttl: float = 30) -> Iterator[None]:
    """Hold the lock on ``key`` as an owner outside every execution, for the block."""
    coordinator = Coordinator()
    blocker = coordinator.admit([LockClaim(key=key, ttl=ttl)], Holder(owner="elsewhere"))
    assert isinstance(blocker, Admitted), blocker
    try:
        yield
    finally:
        coordinator.release(blocker, "success")


def assert_listed_in_order(rows: list[dict[str, Any]], ordering: str | None) -> None:
    """Live-holds listing rows (``holds_index.page``) in ``ordering``: by acquisition (``None``
    ascending, ``"-acquired"`` descending) or by time left (``"ttl"`` / ``"-ttl"``, as each page
    read it: pages are read a few ms apart, so half a second of slack)."""
    if ordering in (None, "acquired", "-acquired"):
        stamps = [r["acquired_at"] for r in rows]
        assert stamps == sorted(stamps, reverse=ordering == "-acquired"), stamps
        return
    left = [r["ttl_left"] for r in rows]
    if ordering == "ttl":
        assert all(b >= a - 0.5 for a, b in pairwise(left)), left
    else:
        assert all(b <= a + 0.5 for a, b in pairwise(left)), left


def churn_between_pages(
    coordinator: Coordinator, churn: list[Admitted], stem: str, owner: str
) -> None:
    """What a listing sees change between two of its pages: three new semaphore holds arrive
    (keys ``<stem>:0`` to ``<stem>:2``, held by ``owner``, appended to ``churn``) and the
    oldest of ``churn`` leave until four are left. The caller releases what is left at the end."""
    for n in range(3):
        fresh = coordinator.admit([SemaphoreClaim(f"{stem}:{n}", limit=1)], Holder(owner=owner))
        assert isinstance(fresh, Admitted)
        churn.append(fresh)
    while len(churn) > 4:
        coordinator.release(churn.pop(0), "success")


def redis_micros(hold: Any) -> int:
    """Admission time of a hold, from Redis ``TIME`` (``"seconds.micros"``), in µs."""
    assert isinstance(hold, TrackedHold)
    seconds, micros = hold.detail["time"].split(".")
    return int(seconds) * 1_000_000 + int(micros)


def refused_micros(refused: Refused) -> int:
    """When Redis refused, from its ``TIME``, in µs."""
    seconds, micros = refused.detail.time.split(".")
    return int(seconds) * 1_000_000 + int(micros)


def probe_across_edge(
    coordinator: Coordinator, claim: Claim, edge_micros: int, name: str, timeout: float = 10.0
) -> None:
    """Admit ``claim`` from just before ``edge_micros`` (Redis time) until it is admitted, and
    assert that the edge is exact: every refusal was answered before it, the admission at or
    after it. Judged by Redis's own clock, not by when the test slept: a probe a stalled
    thread sent late is admitted, and that is right."""
    left = (edge_micros - redis_now_micros(coordinator)) / 1_000_000
    time.sleep(max(left - 0.05, 0))
    deadline = time.monotonic() + timeout
    refusals: list[int] = []
    while True:
        answer = coordinator.admit([claim], Holder(owner=f"{name}-{len(refusals)}"))
        if isinstance(answer, Admitted):
            admitted_at = redis_micros(answer.holds[-1])
            coordinator.release(answer, "success")
            break
        assert isinstance(answer, Refused), answer
        refusals.append(refused_micros(answer))
        assert time.monotonic() < deadline, "never admitted past the edge"
        time.sleep(0.01)
    assert all(at < edge_micros for at in refusals), (refusals, edge_micros)
    assert admitted_at >= edge_micros, (admitted_at, edge_micros)


def redis_now_micros(coordinator: Coordinator) -> int:
    seconds, micros = coordinator.client.time()
    return int(seconds) * 1_000_000 + int(micros)


def start_in_line_order(threads: list[threading.Thread], key: str, timeout: float = 10.0) -> None:
    """Start ``threads`` one at a time, each once the one before has taken its place on the
    ordered lock ``key`` (or ended): arrival order is the list's however slow the machine is,
    never a guess at how long a start takes."""
    from reactor_app.testing import coordination_state

    for thread in threads:
        before = coordination_state().ordered_lock(key).next
        thread.start()
        deadline = time.monotonic() + timeout
        while coordination_state().ordered_lock(key).next == before and thread.is_alive():
            assert time.monotonic() < deadline, f"{thread.name} never took a place on {key!r}"
            time.sleep(0.005)


def command_calls(client: Any) -> dict[str, int]:
    """How many times the server ran each command so far (``INFO commandstats``, by its
    ``cmdstat_<name>`` key): read before and after, on a server of the test's own."""
    stats = client.info("commandstats")
    return {name: int(values["calls"]) for name, values in stats.items()}


def pass_time_on(client: Any, names: Iterable[str], shift_ms: int) -> None:
    """What waiting ``shift_ms`` does to the lifetimes of the keys ``names``, without the wait:
    each existing key's is shortened by that much, and one whose life runs out is gone (the
    lifetime tests move the scores that hold times back alike themselves)."""
    for name in names:
        left = client.pttl(name)
        if left == -2:
            continue
        assert left > 0, f"{name} has no expiry"
        if left <= shift_ms:
            client.delete(name)
        else:
            client.pexpire(name, left - shift_ms)


def pexpires(client: Any) -> int:
    """``PEXPIRE``s the server ran so far (``command_calls``): what the lifetime rules spare."""
    return command_calls(client).get("cmdstat_pexpire", 0)
