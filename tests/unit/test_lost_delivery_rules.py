"""``engine.lost_deliveries``: what counts as losses in a row, and what a point of the work is.

The worker tests (tests/worker/test_lost_deliveries.py) kill real pool processes; these
properties state the rules those runs follow, over every sequence of losses and progress and
every change a write may make to a stored context.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from reactor_app.conf import reactor_settings
from reactor_app.engine.lost_deliveries import counted, fails_next_unit, position, skips_compensate
from reactor_app.engine.state import ROWS, LostDeliveries
from reactor_app.exceptions import ConfigurationError, DeliveryLost, StepFailed

#: what happens to an execution between two deliveries: a delivery lost, or progress made
EVENTS = st.lists(st.sampled_from(["lost", "progress"]), max_size=40)


@given(events=EVENTS, limit=st.integers(min_value=0, max_value=6))
def test_a_verdict_comes_exactly_at_the_limit_of_losses_in_a_row_at_one_point(
    events: list[str], limit: int
) -> None:
    point, entry = 0, None
    in_a_row = 0
    for event in events:
        if event == "progress":
            point += 1
            in_a_row = 0
            continue
        in_a_row += 1
        entry = counted(entry, f"p{point}")
        assert entry == LostDeliveries(count=in_a_row, at=f"p{point}")
        assert fails_next_unit(entry["count"], limit) == (limit > 0 and in_a_row >= limit)


#: stored-context keys a park, a requeue, a kept hold's renewal or the count itself change
UNTOUCHED_BY_PROGRESS = [
    "parked_on",
    "requeue_at",
    "requeue_token",
    "kept_holds",
    "outages",
    "contention",
    "ordered",
    "lost_deliveries",
    "reactor_admitted",
]
#: stored-context changes a progress write makes (``engine.progress``), one per kind of unit
PROGRESS: list[tuple[str, Any]] = [
    (ROWS, 8),  # a step's result, a map's batch of elements
    ("next_index", 3),  # the next step
    ("attempts", {"s1": 2}),  # an attempt spent before a park
    ("pending_failures", {"s1": {}, "s2": {}}),  # a failed attempt waiting for its retry
    ("rolling_back", {"status": "failed", "done": 2}),  # a rollback hook done
    ("results", {"s0": 1, "s1": 2}),  # an older row: its growing parts in the context
    ("completed", [{}, {}]),
]

BASE: dict[str, Any] = {
    ROWS: 7,
    "next_index": 2,
    "attempts": {"s1": 1},
    "pending_failures": {"s1": {}},
    "rolling_back": {"status": "failed", "done": 1},
    "results": {"s0": 1},
    "completed": [{}],
}

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(key=st.sampled_from(UNTOUCHED_BY_PROGRESS), noted=JSON, child=st.booleans())
def test_what_a_park_writes_leaves_the_point_where_it_was(
    key: str, noted: Any, child: bool
) -> None:
    parked = {**BASE, key: noted}
    if child:  # a composed child's row, after its parent's
        assert position([BASE, parked]) == position([BASE, BASE])
    else:
        assert position([parked]) == position([BASE])


@given(change=st.sampled_from(PROGRESS), child=st.booleans())
def test_every_kind_of_progress_moves_the_point(change: tuple[str, Any], child: bool) -> None:
    key, moved = change
    progressed = {**BASE, key: moved}
    if child:
        assert position([BASE, progressed]) != position([BASE, BASE])
    else:
        assert position([progressed]) != position([BASE])


def test_a_composed_child_started_moves_the_point() -> None:
    assert position([BASE, {}]) != position([BASE])


def test_only_a_verdict_given_again_at_one_point_skips_the_compensate() -> None:
    first = DeliveryLost("lost", step="s1", lost=3, limit=3)
    again = DeliveryLost("lost", step="s1", lost=4, limit=3)
    again.again = True
    assert not skips_compensate(first)
    assert skips_compensate(again)
    assert not skips_compensate(StepFailed("failed", step="s1"))


@given(events=EVENTS)
def test_a_verdict_given_stays_on_record_while_the_losses_stay_at_its_point(
    events: list[str],
) -> None:
    given_at = LostDeliveries(count=3, at="p0", given=3)
    entry = given_at
    for event in events:
        if event == "progress":
            entry = counted(entry, "elsewhere")
            assert "given" not in entry
            return
        entry = counted(entry, "p0")
        assert entry["given"] == 3


@pytest.mark.parametrize("value", [0, 1, 3, 100])
def test_the_limit_is_a_whole_number_and_zero_turns_the_guard_off(value: int) -> None:
    with override_settings(REACTOR_LOST_DELIVERY_LIMIT=value):
        configured = reactor_settings.LOST_DELIVERY_LIMIT
    assert configured == value
    assert not fails_next_unit(10**6, 0)


@pytest.mark.parametrize("value", [-1, 2.5, True, "3", None])
def test_a_limit_that_is_not_a_whole_number_is_refused_with_its_name(value: Any) -> None:
    with (
        override_settings(REACTOR_LOST_DELIVERY_LIMIT=value),
        pytest.raises(ConfigurationError, match="REACTOR_LOST_DELIVERY_LIMIT"),
    ):
        _ = reactor_settings.LOST_DELIVERY_LIMIT
