"""A sweep timer failing again and again (Redis or the database away) says so once with a
traceback, then a line at most every ``repeat_every`` seconds, then once when it works again
(``engine.failure_streak``).

Before, each failure of each process's timer logged its whole traceback every interval: during
an outage the worker's log was mostly those, and the lines that said what became of the
executions scrolled out of any bounded tail.

The property runs the streak on a clock the test steps (what is checked is how often it
logs, not any coordination); the timer test runs a real timer thread against an unreachable
Redis, then the real one.
"""

from __future__ import annotations

import itertools
import logging
import time

import pytest
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from reactor_app.engine.failure_streak import FailureStreak
from reactor_app.engine.sweeper import SweepTimer
from tests.worker.helpers import wait_until

REPEAT_EVERY = 10.0

#: a run of the job: whether it failed, and how long after the previous run it came
RUNS = st.lists(
    st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=2 * REPEAT_EVERY)),
    max_size=60,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(max_examples=300, deadline=None)
@given(runs=RUNS)
def test_a_streak_logs_its_traceback_once_then_a_line_at_most_every_interval(
    runs: list[tuple[bool, float]],
) -> None:
    clock, kept = Clock(), Kept()
    log = logging.getLogger(f"{__name__}.streak")
    log.propagate = False
    log.addHandler(kept)
    log.setLevel(logging.DEBUG)
    try:
        streak = FailureStreak("job", repeat_every=REPEAT_EVERY, clock=clock, log=log)
        # per run: its time, whether it failed, and the records it logged
        seen: list[tuple[float, bool, list[logging.LogRecord]]] = []
        for failed, after in runs:
            clock.now += after
            before = len(kept.records)
            if failed:
                try:
                    raise ConnectionError("Error 111 connecting to 127.0.0.1:1.\nRefused.")
                except ConnectionError as error:
                    streak.failed(error)
            else:
                streak.succeeded()
            seen.append((clock.now, failed, kept.records[before:]))
    finally:
        log.removeHandler(kept)

    streaks, ended = _streaks(seen)
    tracebacks = [r for r in kept.records if r.exc_info]
    assert len(tracebacks) == len(streaks)
    recoveries = [r for r in kept.records if "works again" in r.getMessage()]
    assert len(recoveries) == ended
    for failures in streaks:
        reports = [(at, records) for at, _, records in failures if records]
        # the first failure is reported, with its traceback
        assert reports and reports[0][0] == failures[0][0]
        assert reports[0][1][0].exc_info
        # reports at least repeat_every apart, each later one a line without a traceback
        for (earlier, _), (later, records) in itertools.pairwise(reports):
            assert later - earlier >= REPEAT_EVERY
            (line,) = records
            assert not line.exc_info and "\n" not in line.getMessage()
        # and no failure goes unreported for as long as that
        for at, _, _ in failures:
            last = max(when for when, _ in reports if when <= at)
            assert at - last < REPEAT_EVERY
        # a line counts the failures so far
        for number, (_, _, records) in enumerate(failures, start=1):
            for record in records:
                if "still failing" in record.getMessage():
                    assert f" {number} times in a row" in record.getMessage()
    # a success that ends no streak logs nothing
    for index, (_, failed, records) in enumerate(seen):
        if not failed and (index == 0 or not seen[index - 1][1]):
            assert records == []


Run = tuple[float, bool, list[logging.LogRecord]]


def _streaks(seen: list[Run]) -> tuple[list[list[Run]], int]:
    """The maximal runs of failures, and how many of them a success ended."""
    streaks: list[list[Run]] = []
    ended = 0
    for index, run in enumerate(seen):
        if not run[1]:
            ended += bool(index and seen[index - 1][1])
        elif index and seen[index - 1][1]:
            streaks[-1].append(run)
        else:
            streaks.append([run])
    return streaks, ended


@pytest.mark.django_db(transaction=True)
def test_a_sweep_timer_during_an_outage_logs_one_traceback_then_lines_then_its_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="reactor_app.engine.failure_streak")
    timer = SweepTimer(interval=0.02)
    timer.streak.repeat_every = 0.3
    with override_settings(REACTOR_REDIS_URL="redis://127.0.0.1:1/0"):
        started = time.time()
        timer.start()
        try:
            wait_until(lambda: timer.streak.failures >= 40, 30, message="the timer never ran")
            time.sleep(0.4)  # at least one more report's interval
            read_at = time.time()
        except BaseException:
            timer.stop()
            raise
    try:
        wait_until(lambda: timer.streak.failures == 0, 30, message="the sweep never worked again")
    finally:
        timer.stop()
    records = [r for r in caplog.records if r.name == "reactor_app.engine.failure_streak"]
    assert len([r for r in records if r.exc_info]) == 1
    lines = [r for r in records if "still failing" in r.getMessage() and r.created <= read_at]
    assert lines and all("ConnectionError" in line.getMessage() for line in lines)
    # at most a line per 0.3 s however many failures came meanwhile (one per 0.02 s or so,
    # fewer on a loaded machine: the bound is by the time, which holds either way)
    assert len(lines) <= (read_at - started) / 0.3 + 1
    assert len([r for r in records if "works again" in r.getMessage()]) == 1
