"""A worker delivery that dies right after creating a composed child's row, before the state
naming it is written: the redelivery must not leave that row behind.

Found by the saga model's kills (a worker child SIGKILLed while the redelivery of a retry
went from a map to a ``compose`` step): the child's ``INSERT`` had committed, the parent's
state naming it had not, so the redelivery created a second child and the first stayed
``pending`` for good. The row and the state now commit together (``engine.children.run_child``).

The death is a ``BaseException`` the engine does not catch, raised in the parent's write of
its state (as a ``SIGKILL`` at that moment would leave it unwritten); deliveries run in this
process, stepped by the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import Reactor, Step, Success, compose, step
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client
from reactor_app.engine.dispatch import deliver
from reactor_app.engine.executor import ExecutionRun
from reactor_app.managers import ExecutionManager
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

LOG: list[str] = []


class Died(BaseException):
    """The delivery's process is gone."""


class Work(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        LOG.append(context.reactor)
        return Success(None)


class Child(Reactor):
    inner = step(Work)


class Parent(Reactor):
    first = step(Work)
    sub = compose(Child)


@pytest.fixture(autouse=True)
def in_process(settings: Any) -> Iterator[None]:
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    LOG.clear()
    yield


def test_a_delivery_dying_after_a_childs_insert_leaves_no_row_behind(monkeypatch: Any) -> None:
    armed: list[bool] = []
    deaths = [1]  # the first delivery only
    start, persist = ExecutionManager.start, ExecutionRun.persist

    def started(self: Any, **fields: Any) -> Any:
        row = start(self, **fields)
        if fields.get("parent") is not None and deaths:
            armed.append(True)  # the child's row is written: die at the parent's next write
        return row

    def persisted(self: ExecutionRun, **fields: Any) -> None:
        if armed:
            armed.clear()
            deaths.clear()
            raise Died
        persist(self, **fields)

    monkeypatch.setattr(ExecutionManager, "start", started)
    monkeypatch.setattr(ExecutionRun, "persist", persisted)
    execution = Parent.run_async()
    root = str(execution.id)
    with pytest.raises(Died):
        deliver(root)
    get_client().delete(redis_key("claim", root))  # as its TTL would let it lapse
    deliver(root)
    rows = Execution.objects.filter(root_id=root).exclude(pk=root)
    assert [row.status for row in rows] == [ExecutionStatus.SUCCEEDED], [
        (str(row.pk), row.status) for row in rows
    ]
    assert Execution.objects.get(pk=root).status == ExecutionStatus.SUCCEEDED
