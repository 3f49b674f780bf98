"""The engine's outcome vocabularies keep the strings they always had (task results, Result)."""

from __future__ import annotations

import json

from reactor_app.engine.outcomes import PassEnd, RunEnd, UnitStatus, release_outcome


def test_the_values_are_the_old_strings() -> None:
    assert [s.value for s in UnitStatus] == [
        "completed",
        "skipped",
        "failed",
        "halted",
        "parked",
        "interrupted",
        "dispatched",
    ]
    assert [s.value for s in PassEnd] == [
        "succeeded",
        "halted",
        "failed",
        "cancelled",
        "parked",
        "interrupted",
        "handed_off",
    ]
    assert PassEnd.PARKED == "parked"
    assert json.dumps({"outcome": PassEnd.HANDED_OFF}) == '{"outcome": "handed_off"}'


def test_each_end_of_a_pass_releases_the_reactor_holds_as_before() -> None:
    assert {end.value: release_outcome(RunEnd(end)) for end in PassEnd} == {
        "succeeded": "success",
        "halted": "halt",
        "failed": "failure",
        "cancelled": "halt",
        "parked": "park",
        "interrupted": "park",
        "handed_off": "park",
    }
    assert release_outcome(None) == "failure"  # the pass ended by an exception
