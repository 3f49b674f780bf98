"""The execution state's JSON: rows written before the state was typed load unchanged, and
the typed state writes the same top-level keys and shapes."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from reactor_app.engine.state import CompletedStep, ExecutionState

#: a row with every key the engine writes, as the engine wrote it when the notes were kept in
#: one free-form dict (``ExecutionState.extra``): the top level is flat
OLD_ROW: dict[str, Any] = {
    "version": 1,
    "results": {"charge": {"__reactor_type__": "decimal", "value": "9.99"}, "audit": "ok"},
    "completed": [
        {
            "step": "charge",
            "kind": "step",
            "args": {"account_id": 1},
            "result": {"__reactor_type__": "decimal", "value": "9.99"},
            "child_execution": None,
            "elements": [],
        }
    ],
    "ordered": {"": {"key": "acct:1", "nonce": "n1", "epoch": 3}},
    "contention": {"charge": 2},
    "next_index": 2,
    "worker": True,
    "dispatch": {"kind": "async_step", "step": "charge", "label": "charge[0]"},
    "retry": {"of": "e-old", "from_step": "charge", "reused": ["audit"], "by": "operator"},
    "children": {"sub": "e-child"},
    "async": {
        "notify": {"child": "e-async", "kind": "async_step", "args": {"to": "x"}, "timeout": 30.0}
    },
    "map_parallel": {
        "fan": {
            "elements": [{"label": "fan[0]", "execution": "e-el", "args": {"n": 0}}],
            "looks": 2,
        }
    },
    "map_progress": {
        "each": {
            "elements": [
                {"label": "each[0]", "args": {"n": 0}, "result": 0, "child_execution": None}
            ],
            "values": [0],
            "index": 1,
        }
    },
    "interrupts": {
        "approve": {
            "since": "2026-01-01T00:00:00+00:00",
            "correlation_id": "c-1",
            "deadline": None,
            "payload": {"ok": True},
            "resumed_at": "2026-01-01T00:01:00+00:00",
        }
    },
    "reactor_admitted": True,
    "kept_holds": [
        {"primitive": "lock", "key": "acct:1", "token": 7},
        {"primitive": "semaphore", "key": "pool", "limit": 2},
    ],
    "parked_on": {
        "execution": "e-1",
        "step": "charge",
        "primitive": "lock",
        "key": "acct:1",
        "at": 1767225600.5,
    },
    "requeue_at": "2026-01-01T00:02:00+00:00",
    "requeue_token": "t-1",
    "outages": 3,
    "attempts": {"charge": 1},
    "skipped": False,
    "halt_reason": None,
}


def through_the_database(data: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def test_an_old_row_loads_into_the_typed_fields() -> None:
    state = ExecutionState.from_json(through_the_database(OLD_ROW))
    assert state.results == {"charge": Decimal("9.99"), "audit": "ok"}
    assert state.completed == [
        CompletedStep(step="charge", kind="step", args={"account_id": 1}, result=Decimal("9.99"))
    ]
    assert state.ordered == {"": {"key": "acct:1", "nonce": "n1", "epoch": 3}}
    assert (state.contention, state.next_index) == ({"charge": 2}, 2)
    assert state.origin.worker is True
    assert state.origin.dispatch == {"kind": "async_step", "step": "charge", "label": "charge[0]"}
    assert state.origin.retry is not None and state.origin.retry["reused"] == ["audit"]
    assert state.children.composed == {"sub": "e-child"}
    assert state.children.pending_async is not None
    assert state.children.pending_async["notify"]["timeout"] == 30.0
    assert state.children.parallel_maps is not None
    assert state.children.parallel_maps["fan"]["looks"] == 2
    assert state.children.map_progress is not None
    assert state.children.map_progress["each"]["index"] == 1
    assert state.interrupts is not None and state.interrupts["approve"]["payload"] == {"ok": True}
    assert state.continuation.reactor_admitted is True
    assert state.continuation.kept_holds == OLD_ROW["kept_holds"]
    assert state.continuation.parked_on is not None
    assert state.continuation.parked_on["at"] == 1767225600.5
    assert state.continuation.requeue_at == "2026-01-01T00:02:00+00:00"
    assert state.continuation.requeue_token == "t-1"
    assert state.continuation.outages == 3
    assert state.continuation.spent_attempts == {"charge": 1}
    assert state.ending.skipped is False
    assert (state.ending.halted, state.ending.halt_reason) == (True, None)
    assert state.unknown == {}


def test_an_old_row_is_written_back_unchanged() -> None:
    """Same keys, same shapes: what the old code reads back (a null halt reason stays
    present, and so do maps that emptied)."""
    emptied = {**OLD_ROW, "children": {}, "async": {}, "map_parallel": {}, "attempts": {}}
    for row in (OLD_ROW, emptied):
        state = ExecutionState.from_json(through_the_database(row))
        assert through_the_database(state.to_json()) == row


def test_keys_of_another_version_are_kept() -> None:
    row = {**OLD_ROW, "written_by_a_later_version": {"x": 1}}
    state = ExecutionState.from_json(through_the_database(row))
    assert state.unknown == {"written_by_a_later_version": {"x": 1}}
    assert through_the_database(state.to_json()) == row


def test_a_fresh_state_writes_only_the_core_keys() -> None:
    assert ExecutionState().to_json() == {
        "version": 1,
        "results": {},
        "completed": [],
        "ordered": {},
        "contention": {},
        "next_index": 0,
    }


def test_every_field_set_round_trips_as_the_old_layout() -> None:
    """Set through the typed fields, the state writes the row of ``OLD_ROW`` exactly — so the
    old code, which read every non-core key as it came, loads it — and reads back equal."""
    state = ExecutionState(
        results={"charge": Decimal("9.99"), "audit": "ok"},
        completed=[
            CompletedStep(
                step="charge", kind="step", args={"account_id": 1}, result=Decimal("9.99")
            )
        ],
        ordered={"": {"key": "acct:1", "nonce": "n1", "epoch": 3}},
        contention={"charge": 2},
        next_index=2,
    )
    state.origin.worker = True
    state.origin.dispatch = {"kind": "async_step", "step": "charge", "label": "charge[0]"}
    state.origin.retry = {
        "of": "e-old",
        "from_step": "charge",
        "reused": ["audit"],
        "by": "operator",
    }
    state.children.composed_runs()["sub"] = "e-child"
    state.children.async_children()["notify"] = {
        "child": "e-async",
        "kind": "async_step",
        "args": {"to": "x"},
        "timeout": 30.0,
    }
    state.children.parallel()["fan"] = {
        "elements": [{"label": "fan[0]", "execution": "e-el", "args": {"n": 0}}],
        "looks": 2,
    }
    state.children.progress()["each"] = {
        "elements": [{"label": "each[0]", "args": {"n": 0}, "result": 0, "child_execution": None}],
        "values": [0],
        "index": 1,
    }
    state.reached_interrupts()["approve"] = {
        "since": "2026-01-01T00:00:00+00:00",
        "correlation_id": "c-1",
        "deadline": None,
        "payload": {"ok": True},
        "resumed_at": "2026-01-01T00:01:00+00:00",
    }
    continuation = state.continuation
    continuation.reactor_admitted = True
    continuation.kept_holds = [
        {"primitive": "lock", "key": "acct:1", "token": 7},
        {"primitive": "semaphore", "key": "pool", "limit": 2},
    ]
    continuation.parked_on = {
        "execution": "e-1",
        "step": "charge",
        "primitive": "lock",
        "key": "acct:1",
        "at": 1767225600.5,
    }
    continuation.requeue_at = "2026-01-01T00:02:00+00:00"
    continuation.requeue_token = "t-1"
    continuation.outages = 3
    continuation.attempts()["charge"] = 1
    state.ending.skipped = False
    state.ending.halted, state.ending.halt_reason = True, None

    written = through_the_database(state.to_json())
    assert written == OLD_ROW
    assert ExecutionState.from_json(written) == state


def test_peek_reads_the_notes_without_decoding() -> None:
    peeked = ExecutionState.peek(OLD_ROW)
    assert peeked.results["charge"] == {"__reactor_type__": "decimal", "value": "9.99"}
    assert peeked.continuation.requeue_token == "t-1"
    assert peeked.ending.halt_reason is None and peeked.ending.halted
    assert ExecutionState.peek(None).origin.dispatch is None
