"""The ordered-lock position a new run takes at enqueue, and a delivery that came first.

A run of a reactor with a reactor-level ordered lock takes its place in the line once its row
is committed, then saves it in the row (``engine.enqueueing``). A delivery can claim the row in
between — a cancel's delivery, a sweeper's — and read the context without that position; that
pass never gives the position back, and the line waits a whole poison-pill timeout for it.
Found in CI (``tests/worker/test_cancel.py``: a pending run cancelled inside the transaction
that started it; the next run on the key stayed parked). The save is conditional on nobody
having claimed the row; a position that could not be saved goes back to the line at once.
"""

from __future__ import annotations

import uuid

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.engine.enqueueing import _take_position_at_enqueue
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.worker.cancel_reactors import InLineReactor

pytestmark = pytest.mark.django_db


def _pending_row(key: str) -> tuple[Execution, str]:
    execution = Execution.objects.start(
        reactor=InLineReactor.path(), inputs={"key": key}, status=ExecutionStatus.PENDING
    )
    return execution, f"cancel-line:{key}"


def test_a_position_taken_before_any_delivery_is_saved_in_the_row() -> None:
    execution, line = _pending_row(uuid.uuid4().hex[:8])
    _take_position_at_enqueue(InLineReactor, line, execution)
    saved = Execution.objects.get(pk=execution.pk).context["ordered"]
    assert next(iter(saved.values()))["key"] == line
    head = Coordinator().peek(line)
    assert head is not None and head.execution == str(execution.pk)


@pytest.mark.parametrize("first", ["claimed", "ended"])
def test_a_position_a_delivery_could_not_see_goes_back_to_the_line(first: str) -> None:
    execution, line = _pending_row(uuid.uuid4().hex[:8])
    if first == "claimed":
        # a delivery claimed the row before the position was saved: it runs without it
        assert Execution.objects.claim(execution.pk, (ExecutionStatus.PENDING,)) is not None
    else:
        # ... or already ended it (a cancel's delivery)
        Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.CANCELLED)
    _take_position_at_enqueue(InLineReactor, line, execution)
    assert "ordered" not in (Execution.objects.get(pk=execution.pk).context or {})
    assert Coordinator().peek(line) is None  # the line moved past it: nobody waits
