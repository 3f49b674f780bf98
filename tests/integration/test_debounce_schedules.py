"""Generated schedules of debounced starts, commits and deliveries: each burst runs once, its
last start, and every other start of it names that one.

A schedule interleaves, on two burst keys (one with a ``max_wait``):

* **start** — ``run_async(..., debounce=...)``, committed at once; or (PostgreSQL) left open in
  a transaction of its own thread, as a web request that placed its start in Redis and has not
  committed its row yet (SQLite lets one writer in at a time: a transaction held open there
  would block every other write of the schedule); or committed with its settle held back, as a
  process that stalls between its commit and its on-commit hook;
* **commit** — an open start commits (its row becomes visible and its settle runs, on commit),
  or a held-back settle runs;
* **deliver** — the next message arrives: of the committed starts without an outcome, the one
  due first, never before its due time on the Redis clock, as a countdown delivers it;
* **redeliver** — a duplicate of any committed start's message (at least once delivery);
* **wait** — time passes, so that bursts come due and later starts open new ones.

What the engine promises assumes one thing of the web side (docs/coordination.md, "Debounce"):
a start commits, and settles, before it is due — here, an open start is committed and a
held-back settle run when its due time comes near. A delivery told to wait (``debounce_wait``:
the start that replaced it is not committed yet) is delivered again later, as its countdown
requeue would be. At the end every open start commits, every settle runs, and every start is
delivered until it has an outcome.

Then, with a start's **burst** read off Redis's answer when it was placed (the starts it
replaces): each burst has exactly one start that ran — its last — whose body ran once; every
other start of the burst ended ``superseded``, naming it; no start ran twice, however many
deliveries it got.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from hypothesis import HealthCheck, Phase, example, given, settings
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
#: an open start is committed (a held-back settle run) once its due time is this near
#: (seconds), before the schedule's next operation
COMMIT_MARGIN = 0.002
#: what a delivery ends with; anything else (``debounce_wait``) is delivered again
FINAL = {"succeeded", "superseded", "nothing_to_do"}

#: a start: its burst key, how it commits (at once; held open; committed with its settle held
#: back) and the time (seconds) that passes before it (most often none: bursts of several)
START = st.tuples(
    st.just("start"),
    st.integers(0, 1),
    st.sampled_from(["commit", "open", "settle late"]),
    st.sampled_from([0.0, 0.0, 0.03, 0.08]),
)
OPERATION = {
    "start": START,
    "deliver": st.tuples(st.just("deliver")),
    "redeliver": st.tuples(st.just("redeliver"), st.integers(0, 15)),
    "commit": st.tuples(st.just("commit"), st.integers(0, 7)),
    "wait": st.tuples(st.just("wait"), st.just(0.2)),
}
#: a schedule opens with a start; then mostly starts and deliveries
operations = st.tuples(
    START,
    st.lists(
        st.sampled_from(["start"] * 5 + ["deliver"] * 3 + ["redeliver", "commit", "wait"]).flatmap(
            OPERATION.__getitem__
        ),
        min_size=2,
        max_size=15,
    ),
).map(lambda schedule: [schedule[0], *schedule[1]])


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
    """Runs one generated schedule against the real Redis and database.

    ``unfinished`` holds what a start has still to do before it is due: commit (an open
    start: ``OpenStart.commit``, its row not visible yet) or settle (a start committed with its
    settle held back, ``deferred``); ``finish_due`` does it as its due time nears."""

    def __init__(
        self, run: str, placed: dict[str, tuple[list[str], float]], deferred: dict[str, Any]
    ) -> None:
        self.run = run
        self.placed = placed
        self.deferred = deferred
        self.starts: list[Start] = []
        self.unfinished: list[tuple[Start, Callable[[], None]]] = []
        self.open: set[str] = set()
        self.version = 0

    def start(self, burst_index: int, how: str, after: float) -> None:
        if after:
            self.wait(after)
        burst = f"{self.run}:{burst_index}"
        self.version += 1
        if how == "open" and connection.vendor == "postgresql":
            opened = OpenStart(burst, self.version)
            assert opened.execution is not None
            started = self._recorded(opened.execution, burst)
            self.open.add(started.pk)
            self.unfinished.append((started, opened.commit))
        elif how == "settle late":
            self.deferred["next"] = True
            started = self._recorded(start_row(burst, self.version), burst)
            self.unfinished.append((started, self.deferred.pop(started.pk)))
        else:
            self._recorded(start_row(burst, self.version), burst)

    def _recorded(self, execution: Execution, burst: str) -> Start:
        earlier, due = self.placed[str(execution.pk)]
        start = Start(execution, burst, earlier, due)
        self.starts.append(start)
        return start

    def commit(self, index: int) -> None:
        """An open start commits, or a held-back settle runs."""
        if self.unfinished:
            self._finish(self.unfinished[index % len(self.unfinished)])

    def _finish(self, pair: tuple[Start, Callable[[], None]]) -> None:
        self.unfinished.remove(pair)
        self.open.discard(pair[0].pk)
        pair[1]()

    def finish_due(self, before: float) -> None:
        """Commit (or settle) every start due before ``before`` plus the margin: a start
        commits before it is due."""
        for pair in [p for p in self.unfinished if p[0].due - COMMIT_MARGIN <= before]:
            self._finish(pair)

    def sleep_until(self, moment: float) -> None:
        """Let time pass up to ``moment`` (Redis clock), committing open starts (and running
        held-back settles) as they near their due time."""
        while (now := redis_now()) < moment:
            self.finish_due(now)
            nearest = min((s.due - COMMIT_MARGIN for s, _ in self.unfinished), default=moment)
            time.sleep(max(0.0, min(moment, nearest) - now))
        self.finish_due(redis_now())

    def deliver(self) -> None:
        """The next message: of the committed starts without an outcome yet, the one due
        first (a countdown delivers them in that order)."""
        waiting = [s for s in self.starts if s.pk not in self.open and not FINAL & set(s.outcomes)]
        if waiting:
            self._deliver(min(waiting, key=lambda s: s.due))

    def redeliver(self, index: int) -> None:
        """A message of any committed start, again (brokers deliver at least once)."""
        committed = [s for s in self.starts if s.pk not in self.open]
        if committed:
            self._deliver(committed[index % len(committed)])

    def _deliver(self, target: Start) -> None:
        self.sleep_until(target.due)
        target.outcomes.append(delivery.deliver(target.pk)["outcome"])

    def wait(self, seconds: float) -> None:
        self.sleep_until(redis_now() + seconds)

    def finish(self) -> None:
        """Commit what is open and settle what is held back, then deliver every start until
        each has an outcome."""
        while self.unfinished:
            self._finish(self.unfinished[0])
        for _ in range(50):
            pending = [s for s in self.starts if not FINAL & set(s.outcomes)]
            if not pending:
                return
            for start in pending:
                self._deliver(start)
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

    deferred: dict[str, Any] = {}
    settle_on_commit = debounce.settle_on_commit

    def settling(burst: debounce.Burst, earlier: list[str], execution_id: str) -> None:
        # a "settle late" start: its settle is handed to the schedule instead of the commit
        if deferred.pop("next", False):
            deferred[execution_id] = lambda: debounce.settle(burst, earlier, execution_id)
        else:
            settle_on_commit(burst, earlier, execution_id)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(debounce, "place", placing)
        patch.setattr(debounce, "settle_on_commit", settling)
        # the messages are delivered by the schedule: none goes to a broker
        patch.setattr(enqueueing, "_enqueue_or_leave_to_sweeper", lambda *a, **k: None)
        patch.setattr(delivery, "enqueue_quietly", lambda *a, **k: True)

        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            # no shrinking: a schedule's outcome depends on timing as well as on its
            # operations, so a shrunk variant may pass where the schedule failed (and each
            # attempt sleeps through its due times); the failing schedule is shown whole
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        )
        @given(operations)
        # the start that replaced the delivered one is not committed yet: it waits, then
        # finds itself superseded
        @example([("start", 0, "commit", 0.0), ("start", 0, "open", 0.08), ("deliver",)])
        # the replaced start commits after the one that replaced it, which already ran
        @example([("start", 0, "open", 0.0), ("start", 0, "commit", 0.0), ("deliver",)])
        # the replacement committed, its settle not run yet: the delivery marks the start
        @example([("start", 0, "commit", 0.0), ("start", 0, "settle late", 0.08), ("deliver",)])
        # a burst that came due, then a new one on the same key; a duplicate delivery
        @example([("start", 1, "commit", 0.0), ("deliver",), ("start", 1, "commit", 0.0),
                  ("redeliver", 0), ("deliver",)])  # fmt: skip
        def run_schedule(ops: list[tuple[Any, ...]]) -> None:
            schedule = Schedule(f"sched-{uuid.uuid4().hex[:8]}", placed, deferred)
            try:
                for op, *args in ops:
                    getattr(schedule, op)(*args)
            finally:
                schedule.finish()
            check(schedule)

        run_schedule()
