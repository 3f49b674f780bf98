"""Later passes of a run (redelivery after a park, resume after an interrupt) continue its
first admission: the reactor's rate limit is charged once, and a period bucket taken by another
run in the meantime fails the paused run with rollback instead of halting it half-done.

Deliveries run in this process (``deliver`` is the task body); what they enqueue goes to a
queue nobody reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
    from_input,
    interrupt,
    step,
    with_lock,
    with_period,
    with_rate_limit,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.engine.dispatch import deliver
from reactor_app.exceptions import CoordinationError
from reactor_app.testing import assert_rate_limit_count

pytestmark = pytest.mark.django_db(transaction=True)

UNDONE: list[str] = []


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CONTENTION_BACKOFF = [0.01, 0.02]
    UNDONE.clear()
    yield


@with_lock(lambda args: f"side:{args['key']}", ttl=30)
class Contended(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("done")


@with_rate_limit(lambda inputs: f"quota:{inputs['key']}", limit=5, period="minute")
class QuotaReactor(Reactor):
    inputs = ("key",)
    work = step(Contended, key=from_input("key"))


def test_a_parked_run_is_charged_its_rate_limit_once(in_process: None) -> None:
    blocker = Coordinator().admit([LockClaim("side:1", ttl=60)], Holder(owner="test-holder"))
    assert isinstance(blocker, Admitted)
    execution = QuotaReactor.run_async(key=1)
    try:
        for _ in range(3):
            assert deliver(str(execution.id))["outcome"] == "parked"
    finally:
        Coordinator().release(blocker, "success")
    assert deliver(str(execution.id))["outcome"] == "succeeded"
    assert_rate_limit_count("quota:1", "minute", 1)


class Prepare(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success("prepared")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        UNDONE.append(args["key"])


@with_period(lambda inputs: f"daily:{inputs['key']}", every="day")
class DailyReactor(Reactor):
    inputs = ("key",)
    prepare = step(Prepare, key=from_input("key"))
    approval = interrupt(correlation_id=lambda inputs: f"daily:{inputs['key']}")


def test_a_paused_run_whose_bucket_was_taken_meanwhile_fails_and_rolls_back(
    in_process: None,
) -> None:
    paused = DailyReactor.run(key="a")
    assert paused.status == "interrupted"
    other = DailyReactor.run(key="a")
    assert other.status == "interrupted"  # admitted in the same bucket: nothing is marked yet
    assert DailyReactor.resume(other.execution_id, step="approval", payload="ok").ok
    resumed = DailyReactor.resume(paused.execution_id, step="approval", payload="ok")
    assert resumed.status == "failed"
    assert isinstance(resumed.error, CoordinationError)
    assert resumed.error.primitive == "period"
    assert UNDONE == ["a"]  # the paused run's completed step was undone, not left behind
