"""Period race: eight executions of a daily step (or reactor) started together → one body.

Issue 10, item 1: before admission reserved the bucket, the check took nothing and the bucket
was marked only on success, so every racer found it unmarked and ran its body. Here each body
records when it entered and left in a Redis list (shared by threads and forked processes, one
machine clock), and the test asserts exactly one body ran, no two bodies overlapped, every
other racer skipped (step) or halted (reactor) with reason ``period``, and the bucket is done
by the execution whose body ran. Real Redis, real threads and processes, no mocked time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from reactor_app.models import CoordinationEvent, Execution
from reactor_app.testing import coordination_state
from tests.chaos.period_reactors import RACERS, REACTORS, bodies
from tests.concurrency.harness import overlaps, run_in_processes

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


def race_once(level: str, user: str, start_at: float) -> dict[str, Any]:
    """One racer: wait for the common start, run the reactor in this thread or process."""
    from django.db import connection

    time.sleep(max(start_at - time.time(), 0))
    try:
        result = REACTORS[level].run(user=user)
        return {
            "execution": str(result.execution_id),
            "status": result.status,
            "halt": result.halt_reason if result.status == "halted" else None,
        }
    finally:
        connection.close()


def race_in_threads(level: str, user: str) -> list[dict[str, Any]]:
    start_at = time.time() + 0.5
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            results.append(race_once(level, user, start_at))
        except BaseException as exc:  # reported below: a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


def race_in_processes(level: str, user: str) -> list[dict[str, Any]]:
    start_at = time.time() + 1.5  # forking eight interpreters takes a moment
    return run_in_processes(race_once, [(level, user, start_at) for _ in range(RACERS)])


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("level", ["step", "reactor"])
def test_eight_racers_run_the_daily_body_exactly_once(level: str, mode: str) -> None:
    user = f"{level}-{mode}"
    race = race_in_threads if mode == "threads" else race_in_processes
    results = race(level, user)
    assert len(results) == RACERS

    ran = bodies()
    assert len(ran) == 1, f"{len(ran)} bodies ran in one bucket: {ran}"
    assert overlaps(ran) == []
    winner = ran[0][0]

    if level == "step":
        # every run succeeds: one ran the step, the others skipped it and went on
        assert [r["status"] for r in results] == ["succeeded"] * RACERS
        skipped = Execution.objects.filter(
            step_runs__step="digest", step_runs__status="skipped"
        ).count()
        assert skipped == RACERS - 1
    else:
        statuses = sorted((r["status"], r["halt"]) for r in results)
        assert statuses == [("halted", "period")] * (RACERS - 1) + [("succeeded", None)]
        assert next(r for r in results if r["status"] == "succeeded")["execution"] == winner
    assert coordination_state().period_marked_by(f"digest:{user}", "day") == winner
    assert coordination_state().period_reserved(f"digest:{user}", "day") is None


# -- on real Celery workers: racers park on the bucket in flight, then skip or halt -----------


@pytest.fixture(scope="module")
def celery_worker_settings() -> dict[str, Any]:
    # the release's wake-up, not the backoff requeue, is what brings the parked racers back
    return {"REACTOR_CONTENTION_BACKOFF": [2.0, 5.0]}


@pytest.mark.worker
@pytest.mark.parametrize("level", ["step", "reactor"])
def test_eight_executions_on_workers_run_the_daily_body_exactly_once(
    level: str, celery_worker_process: Any
) -> None:
    user = f"{level}-workers"
    first = REACTORS[level].run_async(user=user)
    deadline = time.monotonic() + 60
    while coordination_state().period_reserved(f"digest:{user}", "day") is None:
        assert time.monotonic() < deadline, celery_worker_process.log()
        time.sleep(0.02)
    executions = [first] + [REACTORS[level].run_async(user=user) for _ in range(RACERS - 1)]
    results = [execution.wait(timeout=120) for execution in executions]

    ran = bodies()
    assert len(ran) == 1, f"{len(ran)} bodies ran in one bucket: {ran}"
    winner = ran[0][0]
    statuses = sorted((r.status, r.halt_reason) for r in results)
    if level == "step":
        assert statuses == [("succeeded", None)] * RACERS
    else:
        assert statuses == [("halted", "period")] * (RACERS - 1) + [("succeeded", None)]
    assert winner == str(first.pk)
    # nothing was skipped on a guess: racers that met the bucket in flight parked first
    parks = CoordinationEvent.objects.filter(kind="parked", primitive="period")
    assert parks.exists()
    assert not parks.filter(execution_id=first.pk).exists()
    assert coordination_state().period_marked_by(f"digest:{user}", "day") == winner
    assert celery_worker_process.alive(), celery_worker_process.log()
