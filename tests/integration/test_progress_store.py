"""Checkpoints write what changed (``engine.progress``), and the row reads back as the state.

Property: after any sequence of the changes the engine makes between two writes (results and
rollback-log entries appended, a sequential map's elements appended, its progress replaced or
dropped, the log emptied by a rollback, notes set and cleared), the row's ``context`` reads
back as the state written, and the in-memory copy equals the row. Behaviour: the bytes a
checkpoint sends do not grow with the number of units completed before it; a write whose claim
generation is no longer the row's writes nothing.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.engine.progress import ProgressStore
from reactor_app.engine.state import CompletedStep, ExecutionState
from reactor_app.engine.worker import ClaimLost
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus

pytestmark = pytest.mark.django_db

NAMES = st.sampled_from(["a", "b", "c", "step one", "ü", "x.y", "it's", "a[0]"])
VALUES = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**6),
    st.text(max_size=8),
    st.builds(lambda n: Decimal(n) / 100, st.integers(-9999, 9999)),
    st.lists(st.integers(0, 9), max_size=3),
)

# one change of the state, as (kind, name, value)
CHANGES = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "result",
                "completed",
                "map_element",
                "map_skipped",
                "map_replace",
                "map_drop",
                "rollback",
                "contention",
                "note",
                "note_clear",
                "write",
            ]
        ),
        NAMES,
        VALUES,
    ),
    max_size=40,
)


def fresh_row(context: dict[str, Any] | None = None) -> Execution:
    return Execution.objects.start(
        reactor="tests.Reactor",
        inputs={},
        status=ExecutionStatus.RUNNING,
        **({"context": context} if context is not None else {}),
    )


def apply(state: ExecutionState, kind: str, name: str, value: Any, counter: list[int]) -> None:
    counter[0] += 1
    n = counter[0]
    progress = state.children.progress()
    if kind == "result":
        state.results[f"{name}{n}"] = value
    elif kind == "completed":
        state.completed.append(CompletedStep(step=name, kind="step", args={"v": value}))
    elif kind in ("map_element", "map_skipped"):
        entry = progress.setdefault(name, {"elements": [], "values": [], "index": 0})
        if kind == "map_element":
            entry["elements"].append({"label": f"{name}[{entry['index']}]", "result": value})
        entry["values"].append(value)
        entry["index"] += 1
    elif kind == "map_replace":
        progress[name] = {"elements": [{"label": "x", "result": value}], "values": [], "index": 7}
    elif kind == "map_drop":
        progress.pop(name, None)
    elif kind == "rollback":
        state.completed.clear()
    elif kind == "contention":
        state.contention[name] = n
    elif kind == "note":
        state.continuation.parked_on = {
            "execution": "e",
            "step": name,
            "primitive": "lock",
            "key": str(value),
        }
    elif kind == "note_clear":
        state.continuation.parked_on = None


def assert_row_is(execution: Execution, state: ExecutionState) -> None:
    row = Execution.objects.get(pk=execution.pk)
    assert ExecutionState.from_json(row.context).to_json() == state.to_json()
    assert row.context == execution.context  # the in-memory copy follows the row


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=CHANGES, old_row=st.booleans())
def test_the_row_reads_back_as_the_state_after_any_changes(
    changes: list[tuple[str, str, Any]], old_row: bool
) -> None:
    # an old row: the whole context as a version that rewrote it wrote it
    seed = ExecutionState(results={"seed": 1}, completed=[CompletedStep("seed", "step")])
    execution = fresh_row(seed.to_json() if old_row else None)
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for kind, name, value in changes:
        if kind == "write":
            store.write(state, {"current_step": name}, durable=False)
            assert_row_is(execution, state)
        else:
            apply(state, kind, name, value, counter)
    store.write(state, {}, durable=True)
    assert_row_is(execution, state)


def test_regression_a_map_named_with_a_non_ascii_character_keeps_its_elements() -> None:
    # SQLite matched the path ."ü" against the stored key text "\u00fc" and found nothing:
    # the second element of map "ü" was never appended (found by the property above)
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for _ in range(3):
        apply(state, "map_element", "ü", None, counter)
        store.write(state, {}, durable=False)
    assert_row_is(execution, state)
    assert len(state.children.progress()["ü"]["elements"]) == 3
    # a new key spelt escaped in its path was stored with the backslash itself ("\\u00fc1")
    apply(state, "result", "ü", 1, counter)
    store.write(state, {}, durable=False)
    assert_row_is(execution, state)


def test_regression_a_map_dropped_and_started_again_under_its_name() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    counter = [0]
    for kind in ("map_element", "write", "map_drop", "write", "map_element", "write"):
        if kind == "write":
            store.write(state, {}, durable=False)
        else:
            apply(state, kind, "m", 1, counter)
    assert_row_is(execution, state)


class SentBytes:
    """The sizes of the parameters of every UPDATE of the execution table."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("UPDATE") and "reactor_app_execution" in sql:
            self.sizes.append(len(sql) + sum(len(str(p)) for p in params or ()))
        return execute(sql, params, many, context)


def test_a_checkpoint_sends_the_same_bytes_after_10_steps_as_after_1000() -> None:
    """A step's checkpoint carries its own result and log entry, not all before it."""
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    payload = {"order": "x" * 200}
    sent = SentBytes()
    with connection.execute_wrapper(sent):
        for index in range(1000):
            name = f"step{index:04d}"
            state.results[name] = payload
            state.completed.append(CompletedStep(name, "step", args={"i": index}, result=payload))
            state.next_index = index + 1
            store.write(state, {"current_step": name}, durable=False)
    assert len(sent.sizes) == 1000
    # every checkpoint after the first (which also writes the notes' keys) sends the same
    # size, up to the digits of the counters and timestamps (a whole context would grow by
    # ~500 bytes per step)
    assert max(sent.sizes[1:]) - min(sent.sizes[1:]) <= 16, (min(sent.sizes), max(sent.sizes))
    assert_row_is(execution, state)
    assert len(Execution.objects.get(pk=execution.pk).context["results"]) == 1000


def test_map_elements_are_appended_not_rewritten() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    entry = state.children.progress().setdefault(
        "lines", {"elements": [], "values": [], "index": 0}
    )
    sent = SentBytes()
    with connection.execute_wrapper(sent):
        for index in range(600):
            entry["elements"].append({"label": f"lines[{index:03d}]", "result": index % 10})
            entry["values"].append(index % 10)
            entry["index"] += 1
            if entry["index"] % 50 == 0:  # a batch of 50 elements per write
                store.write(state, {}, durable=False)
    assert len(sent.sizes) == 12
    assert max(sent.sizes[1:]) - min(sent.sizes[1:]) <= 16, (min(sent.sizes), max(sent.sizes))
    assert_row_is(execution, state)


def test_a_write_with_a_superseded_claim_generation_writes_nothing() -> None:
    execution = fresh_row()
    state = ExecutionState.from_json(execution.context)
    store = ProgressStore(execution, state)
    state.results["a"] = 1
    store.write(state, {}, durable=False)
    # another delivery claims the row and ends it
    claimed = Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
    assert claimed is not None and claimed.claim_generation == execution.claim_generation + 1
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.SUCCEEDED)
    state.results["b"] = 2
    with pytest.raises(ClaimLost):
        store.write(state, {"status": ExecutionStatus.FAILED}, durable=True)
    row = Execution.objects.get(pk=execution.pk)
    assert row.status == ExecutionStatus.SUCCEEDED
    assert row.context["results"] == {"a": 1}


def test_the_claim_statement_returns_the_row_only_in_a_runnable_status() -> None:
    execution = fresh_row()
    claimed = Execution.objects.claim(execution.pk, (ExecutionStatus.RUNNING,))
    assert claimed is not None
    assert (claimed.pk, claimed.status, claimed.context) == (
        execution.pk,
        execution.status,
        execution.context,
    )
    assert claimed.claim_generation == 1
    assert Execution.objects.claim(execution.pk, (ExecutionStatus.PARKED,)) is None
    assert Execution.objects.get(pk=execution.pk).claim_generation == 1
