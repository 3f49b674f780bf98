"""A terminal status is final: a delivery that lost its claim writes nothing (issue 31).

Two deliveries of one execution, run in this process on real Redis and the test database: the
first is inside its second step when its claim key vanishes (as with a Redis restarted empty);
a duplicate delivery takes the claim, takes over from the first's checkpoint and ends the
execution. When the first delivery comes back, its failure must not overwrite the row, nor
undo the work the duplicate built on, and the locked first step ran once.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, from_input, step, with_lock
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client
from reactor_app.engine.dispatch import deliver
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.reactors import record, records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

#: the first delivery's second step waits here (by execution id) until the test lets it fail
FIRST_INSIDE: dict[str, threading.Event] = {}
LET_FIRST_FAIL: dict[str, threading.Event] = {}


@with_lock(lambda args: f"resurrect:{args['key']}", ttl=30)
class LockedCharge(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("locked", execution=context.execution_id)
        return Success("charged")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("undo", execution=context.execution_id)


class SlowThenFails(Step):
    """Fails in the first delivery (after the test released it), succeeds in any other."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        inside = FIRST_INSIDE.get(context.execution_id)
        if inside is not None and not inside.is_set():
            inside.set()
            assert LET_FIRST_FAIL[context.execution_id].wait(30)
            raise RuntimeError("the first delivery fails late")
        return Success("notified")


class ResurrectReactor(Reactor):
    inputs = ("key",)

    charge = step(LockedCharge, key=from_input("key"))
    notify = step(SlowThenFails, key=from_input("key"))

    returns = "notify"


def test_a_delivery_that_lost_its_claim_leaves_the_first_terminal_status() -> None:
    execution = ResurrectReactor.run_async(key=1)
    pk = str(execution.id)
    FIRST_INSIDE[pk], LET_FIRST_FAIL[pk] = threading.Event(), threading.Event()
    first: dict[str, Any] = {}

    def first_delivery() -> None:
        try:
            first.update(deliver(pk))
        finally:
            from django.db import connection

            connection.close()

    thread = threading.Thread(target=first_delivery)
    thread.start()
    try:
        assert FIRST_INSIDE[pk].wait(30), "the first delivery never reached its second step"
        # Redis restarted empty, as far as the claim goes: the first delivery does not know
        get_client().delete(redis_key("claim", pk))

        # a duplicate delivery takes the claim and runs the execution from its checkpoint
        second = deliver(pk)
        assert second["outcome"] == "succeeded", second
        row = Execution.objects.get(pk=pk)
        assert row.status == ExecutionStatus.SUCCEEDED
    finally:
        LET_FIRST_FAIL[pk].set()
        thread.join(30)
    assert not thread.is_alive()

    # the first delivery came back failing: it wrote nothing and undid nothing
    assert first["outcome"] == "claim_lost", first
    row = Execution.objects.get(pk=pk)
    assert row.status == ExecutionStatus.SUCCEEDED
    assert row.error is None
    assert row.result == "notified"
    assert [r["execution"] for r in records("locked")] == [pk]  # the locked step ran once
    assert records("undo") == []
    assert row.claim_generation == 2  # one claim statement per delivery


def test_a_duplicate_after_the_end_finds_nothing_to_do() -> None:
    execution = ResurrectReactor.run_async(key=2)
    pk = str(execution.id)
    assert deliver(pk)["outcome"] == "succeeded"
    get_client().delete(redis_key("claim", pk))
    assert deliver(pk)["outcome"] == "nothing_to_do"
    row = Execution.objects.get(pk=pk)
    assert (row.status, row.claim_generation) == (ExecutionStatus.SUCCEEDED, 1)
    assert len(records("locked")) == 1
