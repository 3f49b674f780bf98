"""Generated schedules of debounced starts, commits and deliveries: each burst runs once, its
last start, and every other start of it names that one.

A schedule interleaves, on two burst keys (one with a ``max_wait``):

* **start** — ``run_async(..., debounce=...)``; committed at once, or (PostgreSQL) left open in a
  transaction of its own thread, as a web request that placed its start in Redis and has not
  committed its row yet (SQLite lets one writer in at a time: a transaction held open there
  would block every other write of the schedule);
* **commit** — an open start commits: its row becomes visible and its settle runs (on commit);
* **deliver** — a committed start's message arrives (a duplicate too, once it ended), never
  before its due time on the Redis clock, as a countdown delivers it;
* **wait** — time passes, so that bursts come due and later starts open new ones.

What the engine promises assumes one thing of the web side (docs/coordination.md, "Debounce"):
a start commits before it is due — here, an open start is committed when its due time comes
near. A delivery told to wait (``debounce_wait``: the start that replaced it is not committed
yet) is delivered again later, as its countdown requeue would be. At the end every open start
commits and every start is delivered until it has an outcome.

Then, with a start's **burst** read off Redis's answer when it was placed (the starts it
replaces): each burst has exactly one start that ran — its last — whose body ran once; every
other start of the burst ended ``superseded``, naming it; no start ran twice, however many
deliveries it got.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app.coordination.redis import get_client
from reactor_app.engine import debounce, delivery, enqueueing
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.debounce_reactors import PlainRecompute
from tests.worker.reactors import records

pytestmark = pytest.mark.django_db(transaction=True)

#: the bursts' quiet period (seconds) and the second key's cap on a burst that never settles
QUIET = 0.15
MAX_WAIT = 0.25
#: an open start commits this long (seconds) before its due time at the latest
COMMIT_MARGIN = 0.01
#: what a delivery ends with; anything else (``debounce_wait``) is delivered again
FINAL = {"succeeded", "superseded", "nothing_to_do"}

#: a start: its burst key, held open or not, and the time (seconds) that passes before it
START = st.tuples(
    st.just("start"), st.integers(0, 1), st.booleans(), st.sampled_from([0.0, 0.03, 0.08])
)
DELIVER = st.tuples(st.just("deliver"), st.integers(0, 15))
#: starts and deliveries weigh most: a schedule is mostly bursts and their messages
operations = st.lists(
    st.one_of(
        START,
        START,
        START,
        DELIVER,
        DELIVER,
        st.tuples(st.just("commit"), st.integers(0, 7)),
        st.tuples(st.just("wait"), st.just(0.2)),
    ),
    min_size=3,
    max_size=16,
)


def redis_now() -> float:
    seconds, micros = get_client().time()
    return seconds + micros / 1e6


@dataclass
class Start:
    """One start of the schedule: its row, its place in its burst, how its deliveries ended."""

    execution: Execution
    burst: str
    #: the starts this one replaced when Redis placed it (empty: it opened a burst)
    earlier: list[str]
    #: no earlier than its due time on the Redis clock (the time after placing it + due_in)
    due: float
    outcomes: list[str] = field(default_factory=list)

    @property
    def pk(self) -> str:
        return str(self.execution.pk)


class OpenStart:
    """A ``run_async`` in a transaction of its own thread, left open until ``commit``."""

    def __init__(self, burst: str, version: int) -> None:
        self.execution: Execution | None = None
        self.error: BaseException | None = None
        self._placed = threading.Event()
        self._commit = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(burst, version), daemon=True)
        self._thread.start()
        assert self._placed.wait(30), "the open start did not place itself"
        if self.error is not None:
            raise self.error

    def _run(self, burst: str, version: int) -> None:
        try:
            with transaction.atomic():
                self.execution = start_row(burst, version)
                self._placed.set()
                assert self._commit.wait(60), "never committed"
        except BaseException as error:  # reported to the schedule's thread
            self.error = error
            self._placed.set()
        finally:
            close_old_connections()

    def commit(self) -> None:
        """Commit the row; its settle runs on the commit, in that thread, before this returns."""
        self._commit.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the open start did not commit"
        if self.error is not None:
            raise self.error


def start_row(burst: str, version: int) -> Execution:
    return PlainRecompute.run_async(account_id=9, version=version, debounce=(burst, QUIET))


class Schedule:
    """Runs one generated schedule against the real Redis and database."""

    def __init__(self, run: str, placed: dict[str, tuple[list[str], float]]) -> None:
        self.run = run
        self.placed = placed
        self.starts: list[Start] = []
        self.open: list[tuple[Start, OpenStart]] = []
        self.version = 0

    def start(self, burst_index: int, held_open: bool, after: float) -> None:
        if after:
            self.wait(after)
        burst = f"{self.run}:{burst_index}"
        self.version += 1
        if held_open and connection.vendor == "postgresql":
            opened = OpenStart(burst, self.version)
            assert opened.execution is not None
            self.open.append((self._recorded(opened.execution, burst), opened))
        else:
            self._recorded(start_row(burst, self.version), burst)

    def _recorded(self, execution: Execution, burst: str) -> Start:
        earlier, due = self.placed[str(execution.pk)]
        start = Start(execution, burst, earlier, due)
        self.starts.append(start)
        return start

    def commit(self, index: int) -> None:
        if self.open:
            _, opened = self.open.pop(index % len(self.open))
            opened.commit()

    def commit_due(self, before: float) -> None:
        """Commit every open start due before ``before`` (plus the margin): a start commits
        before it is due."""
        for pair in [p for p in self.open if p[0].due - COMMIT_MARGIN <= before]:
            self.open.remove(pair)
            pair[1].commit()

    def sleep_until(self, moment: float) -> None:
        """Let time pass up to ``moment`` (Redis clock), committing open starts as they near
        their due time."""
        while (now := redis_now()) < moment:
            self.commit_due(now)
            nearest = min((s.due - COMMIT_MARGIN for s, _ in self.open), default=moment)
            time.sleep(max(0.0, min(moment, nearest) - now))
        self.commit_due(redis_now())

    def deliver(self, index: int) -> None:
        committed = self.committed()
        if not committed:
            return
        target = committed[index % len(committed)]
        self.sleep_until(target.due)
        outcome = delivery.deliver(target.pk)["outcome"]
        target.outcomes.append(outcome)

    def committed(self) -> list[Start]:
        held = {s.pk for s, _ in self.open}
        return [s for s in self.starts if s.pk not in held]

    def wait(self, seconds: float) -> None:
        self.sleep_until(redis_now() + seconds)

    def finish(self) -> None:
        """Commit what is open, then deliver every start until each has an outcome."""
        for _, opened in self.open:
            opened.commit()
        self.open.clear()
        for _ in range(50):
            pending = [s for s in self.starts if not FINAL & set(s.outcomes)]
            if not pending:
                return
            for start in pending:
                self.sleep_until(start.due)
                start.outcomes.append(delivery.deliver(start.pk)["outcome"])
            if any(not FINAL & set(s.outcomes) for s in self.starts):
                time.sleep(debounce.WAIT_FOR_LATEST)
        raise AssertionError(f"deliveries never ended: {[s.outcomes for s in self.starts]}")


def bursts_of(starts: list[Start]) -> Iterator[list[Start]]:
    """The bursts, each its starts in the order Redis placed them (a start that replaced
    nothing opened one)."""
    by_pk = {s.pk: s for s in starts}
    members: dict[str, list[Start]] = {}
    for start in starts:
        opener = start.earlier[0] if start.earlier else start.pk
        members.setdefault(opener, []).append(start)
        # what Redis answered: the burst so far, in order, is what this one replaced
        assert [s.pk for s in members[opener][:-1]] == start.earlier, (start.pk, start.earlier)
        assert opener in by_pk
    yield from members.values()


def check(schedule: Schedule) -> None:
    runs = [r["execution"] for r in records("debounced")]
    ids = {s.pk for s in schedule.starts}
    ran = [pk for pk in runs if pk in ids]
    assert len(ran) == len(set(ran)), f"a start ran twice: {ran}"
    rows = {str(r.pk): r for r in Execution.objects.filter(pk__in=ids)}
    for burst in bursts_of(schedule.starts):
        last = burst[-1]
        assert ran.count(last.pk) == 1, (last.pk, last.outcomes, rows[last.pk].status)
        assert rows[last.pk].status == ExecutionStatus.SUCCEEDED
        for start in burst[:-1]:
            row = rows[start.pk]
            assert start.pk not in ran, (start.pk, start.outcomes)
            assert (row.status, str(row.superseded_by_id)) == (
                ExecutionStatus.SUPERSEDED,
                last.pk,
            ), (start.pk, start.outcomes)
            assert row.started_at is None


def test_each_burst_of_a_generated_schedule_runs_once_its_last_start() -> None:
    placed: dict[str, tuple[list[str], float]] = {}
    place = debounce.place

    def placing(burst: debounce.Burst, execution_id: str) -> Any:
        # a per-call debounce has no max_wait: the second key's bursts get theirs here, as
        # ``with_debounce(..., max_wait=...)`` would pass it
        if burst.key.endswith(":1"):
            burst = debounce.Burst(burst.key, burst.seconds, MAX_WAIT)
        answer = place(burst, execution_id)
        placed[execution_id] = (list(answer.earlier), redis_now() + answer.due_in)
        return answer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(debounce, "place", placing)
        # the messages are delivered by the schedule: none goes to a broker
        patch.setattr(enqueueing, "_enqueue_or_leave_to_sweeper", lambda *a, **k: None)
        patch.setattr(delivery, "enqueue_quietly", lambda *a, **k: True)

        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(operations)
        # the start that replaced the delivered one is not committed yet: it waits, then
        # finds itself superseded
        @example([("start", 0, False, 0.0), ("start", 0, True, 0.08), ("deliver", 0)])
        # the replaced start commits after the one that replaced it, which already ran
        @example([("start", 0, True, 0.0), ("start", 0, False, 0.0), ("deliver", 0)])
        # a burst that came due, then a new one on the same key; a duplicate delivery
        @example([("start", 1, False, 0.0), ("deliver", 0), ("start", 1, False, 0.0),
                  ("deliver", 0), ("deliver", 1)])  # fmt: skip
        def run_schedule(ops: list[tuple[Any, ...]]) -> None:
            schedule = Schedule(f"sched-{uuid.uuid4().hex[:8]}", placed)
            try:
                for op, *args in ops:
                    getattr(schedule, op)(*args)
            finally:
                schedule.finish()
            check(schedule)

        run_schedule()
