"""``map_step(..., parallel=True)`` on real worker processes (issue 17 item 3).

One ``celery worker -c 4`` per module. Every element body records its enter/exit interval in
Redis (``tests.worker.map_reactors``); overlap claims are computed from those intervals. The
parent execution is a ``run_async`` on the same worker: it fans the elements out as their own
deliveries, parks holding nothing of them, and joins their results in element order.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from reactor_app.exceptions import HandOffRefused
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.testing import coordination_state
from tests.worker.helpers import overlapping, wait_until
from tests.worker.map_reactors import (
    BOUND_KEY,
    BoundedMapReactor,
    ComposesParallelMap,
    GuardedMapReactor,
    LockedMapReactor,
    ParallelMapReactor,
)
from tests.worker.reactors import records

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# A parked parent is woken by each element's end; the backoff is only its safety net.
WORKER_SETTINGS = {"REACTOR_CONTENTION_CEILING": 200, "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0]}

#: more pool processes than the semaphore allows, so the bound is the semaphore's, not the pool's
CONCURRENCY = 4


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    return CONCURRENCY


def max_overlap(intervals: list[dict[str, Any]]) -> int:
    """The largest number of recorded intervals open at one instant (an end before a start at
    the same instant: touching intervals do not overlap)."""
    events = sorted(
        [(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals],
        key=lambda e: (e[0], e[1]),
    )
    open_now = peak = 0
    for _, delta in events:
        open_now += delta
        peak = max(peak, open_now)
    return peak


def items(*holds: float) -> list[dict[str, Any]]:
    return [{"n": index + 1, "hold": hold} for index, hold in enumerate(holds)]


def element_rows(parent: Execution) -> list[Execution]:
    return list(Execution.objects.filter(parent=parent).order_by("created_at"))


def test_elements_fan_out_to_every_worker_slot_while_the_parent_parks(worker: Any) -> None:
    execution = ParallelMapReactor.run_async(items=items(0.8, 0.8, 0.8, 0.8), fail_on=-1)
    # all four elements inside their bodies at once: the parked parent takes no pool slot
    wait_until(lambda: len(records("enter:element")) == 4, timeout=15)
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.PARKED
    result = execution.wait(timeout=20)
    assert result.ok, result.error

    elements = records("element")
    assert max_overlap(elements) == CONCURRENCY
    assert len({e["pid"] for e in elements}) == CONCURRENCY  # four worker processes
    rows = element_rows(execution)
    assert len(rows) == 4 and {r.status for r in rows} == {ExecutionStatus.SUCCEEDED}
    # each element is its own execution (its holds are its own), part of the parent's tree
    assert {e["execution"] for e in elements} == {str(r.id) for r in rows}
    assert str(execution.id) not in {e["execution"] for e in elements}
    assert {str(r.root_id) for r in rows} == {str(execution.id)}


def test_results_join_in_element_order_not_completion_order(worker: Any) -> None:
    # the first element outlasts the others by seconds: it finishes last however late a
    # loaded machine starts the others
    execution = ParallelMapReactor.run_async(items=items(3.0, 0.1, 0.4), fail_on=-1)
    result = execution.wait(timeout=20)
    assert result.ok, result.error

    finished = [e["item"] for e in sorted(records("element"), key=lambda e: e["end"])]
    assert finished[-1] == 1  # the first element finished last...
    assert [v["item"] for v in result.value] == [1, 2, 3]  # ...and still comes first


def test_a_shared_semaphore_of_two_bounds_the_fan_out(worker: Any) -> None:
    execution = BoundedMapReactor.run_async(items=items(*[0.4] * 6), fail_on=-1)
    holders: set[str] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = coordination_state().semaphore(BOUND_KEY, 2)
        holders.update(h.owner for h in state.holders)
        execution.refresh_from_db()
        if execution.is_terminal:
            break
        time.sleep(0.02)
    result = execution.to_result()
    assert result.ok, result.error

    elements = records("element")
    assert len(elements) == 6
    assert max_overlap(elements) == 2  # never three, and the bound is reached
    assert [v["item"] for v in result.value] == [1, 2, 3, 4, 5, 6]
    # every slot was held by an element's own execution, never by the parked parent
    element_ids = {str(r.id) for r in element_rows(execution)}
    assert holders and holders <= element_ids
    assert str(execution.id) not in holders
    assert coordination_state().semaphore(BOUND_KEY, 2).held == 0


def test_a_lock_keyed_on_the_element_serializes_equal_elements_only(worker: Any) -> None:
    work = [{"n": n, "hold": 0.4} for n in (1, 2, 1, 2)]
    result = LockedMapReactor.run_async(items=work, fail_on=-1).wait(timeout=20)
    assert result.ok, result.error
    assert [v["item"] for v in result.value] == [1, 2, 1, 2]

    elements = records("element")
    for n in (1, 2):
        assert overlapping([e for e in elements if e["item"] == n]) == []
    assert any(a["item"] != b["item"] for a, b in overlapping(elements))


def test_a_failed_element_undoes_the_completed_ones_newest_first(worker: Any) -> None:
    execution = ParallelMapReactor.run_async(items=items(0.5, 0.3, 0.1, 0.7), fail_on=3)
    result = execution.wait(timeout=20)
    assert result.status == ExecutionStatus.FAILED
    assert result.error is not None and result.error.step == "mapped[2]"
    assert "element 3 fails" in result.error.message

    elements = {e["item"]: e for e in records("element")}
    assert set(elements) == {1, 2, 3, 4}  # the others ran to the end before the rollback
    undone = records("undone")
    # the completed elements, newest first, then the step before the map
    newest_first = sorted((1, 2, 4), key=lambda n: elements[n]["end"], reverse=True)
    assert [u["item"] for u in undone] == [*newest_first, "prepare"]
    # undone by the parent (re-taking each element's declarations under its owner)
    assert {u["execution"] for u in undone} == {str(execution.id)}
    statuses = sorted(r.status for r in element_rows(execution))
    assert statuses == sorted([ExecutionStatus.SUCCEEDED] * 3 + [ExecutionStatus.FAILED])


def test_a_parallel_map_in_a_composed_child_is_joined_by_the_root(worker: Any) -> None:
    execution = ComposesParallelMap.run_async(items=items(0.3, 0.1, 0.2), fail_on=-1)
    result = execution.wait(timeout=20)
    assert result.ok, result.error
    assert [v["item"] for v in result.value] == [1, 2, 3]
    assert max_overlap(records("element")) >= 2
    # the elements hang off the root: a finished element wakes the delivery that runs the tree
    rows = element_rows(execution)
    composed = [r for r in rows if not (r.context or {}).get("dispatch")]
    elements = [r for r in rows if (r.context or {}).get("dispatch")]
    assert len(composed) == 1 and composed[0].status == ExecutionStatus.SUCCEEDED
    assert {str(e.id) for e in elements} == {e["execution"] for e in records("element")}
    assert len(elements) == 3


def test_elements_declaring_a_key_the_parent_holds_are_refused_before_any_starts(
    worker: Any,
) -> None:
    execution = GuardedMapReactor.run_async(items=items(0.1, 0.1), fail_on=-1)
    result = execution.wait(timeout=20)
    assert result.status == ExecutionStatus.FAILED
    assert isinstance(result.error, HandOffRefused), result.error
    assert "map_step(parallel=True)" in result.error.message
    assert element_rows(execution) == [] and records("element") == []


def test_in_process_a_parallel_map_runs_its_elements_one_after_another() -> None:
    result = ParallelMapReactor.run(items=items(0.2, 0.2, 0.2), fail_on=-1)
    assert result.ok, result.error
    assert [v["item"] for v in result.value] == [1, 2, 3]
    elements = records("element")
    assert len(elements) == 3 and overlapping(elements) == []
    assert {e["pid"] for e in elements} == {os.getpid()}
    assert {e["execution"] for e in elements} == {result.execution_id}
    assert not Execution.objects.filter(parent_id=result.execution_id).exists()


def test_cancelling_the_parked_parent_waits_for_its_elements_and_undoes_them(worker: Any) -> None:
    execution = ParallelMapReactor.run_async(items=items(0.6, 0.9, 1.2), fail_on=-1)
    wait_until(lambda: len(records("enter:element")) == 3, timeout=15)
    wait_until(
        lambda: Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PARKED, timeout=5
    )
    execution.cancel(reason="changed our mind")
    result = execution.wait(timeout=20)
    assert result.status == ExecutionStatus.CANCELLED, result.error

    elements = {e["item"]: e for e in records("element")}
    assert set(elements) == {1, 2, 3}  # they were running: the rollback waited for them
    newest_first = sorted((1, 2, 3), key=lambda n: elements[n]["end"], reverse=True)
    assert [u["item"] for u in records("undone")] == [*newest_first, "prepare"]
