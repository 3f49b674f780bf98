"""``engine.time_slice``: which limits a delivery is sliced by, and when it stops.

The limits Celery's worker applies to a task are the message's own, else the task's, else the
app's configuration (``celery.worker.request``); a delivery's slice is half of the earlier of
the soft and hard limits, and none when no limit is set. A slice is spent only once a unit of
work has been done in its delivery, so every delivery makes progress.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reactor_app.engine.time_slice import (
    SHARE,
    DeliveryTimeUp,
    SoftTimeLimitExceeded,
    TimeSlice,
    stops_delivery,
    task_limits,
    time_slice,
)

#: what a setting or a message may carry: nothing, zero, a number of seconds, a numeric string
LIMITS = st.one_of(
    st.none(),
    st.just(0),
    st.integers(min_value=1, max_value=10**6),
    st.floats(min_value=0.001, max_value=1e6),
    st.integers(min_value=1, max_value=1000).map(str),
)


def _seconds(value: Any) -> float | None:
    return float(value) if value is not None and float(value) > 0 else None


def _task(message: tuple[Any, Any] | None, own: tuple[Any, Any], conf: tuple[Any, Any]) -> Any:
    return SimpleNamespace(
        request=SimpleNamespace(timelimit=message),
        time_limit=own[0],
        soft_time_limit=own[1],
        app=SimpleNamespace(
            conf=SimpleNamespace(task_time_limit=conf[0], task_soft_time_limit=conf[1])
        ),
    )


@given(
    message=st.one_of(st.none(), st.tuples(LIMITS, LIMITS)),
    own=st.tuples(LIMITS, LIMITS),
    conf=st.tuples(LIMITS, LIMITS),
)
def test_the_limits_are_the_message_s_else_the_task_s_else_the_app_s(
    message: tuple[Any, Any] | None, own: tuple[Any, Any], conf: tuple[Any, Any]
) -> None:
    hard, soft = task_limits(_task(message, own, conf))
    carried = message or (None, None)
    for index, found in enumerate((hard, soft)):
        expected = next(
            (
                _seconds(value)
                for value in (carried[index], own[index], conf[index])
                if _seconds(value) is not None
            ),
            None,
        )
        assert found == expected


@given(hard=LIMITS, soft=LIMITS)
def test_a_delivery_is_sliced_by_the_earlier_limit_and_not_at_all_without_one(
    hard: Any, soft: Any
) -> None:
    clock = time_slice(_seconds(hard), _seconds(soft))
    set_limits = [value for value in (_seconds(hard), _seconds(soft)) if value is not None]
    if not set_limits:
        assert clock is None
        return
    assert clock is not None
    assert clock.limit == min(set_limits)
    assert clock.named == (_seconds(soft) or clock.limit)  # the soft limit is what cuts off


@given(elapsed=st.floats(min_value=0, max_value=100), limit=st.floats(min_value=0.01, max_value=50))
def test_a_slice_is_spent_at_its_share_once_a_unit_ran(elapsed: float, limit: float) -> None:
    clock = TimeSlice(limit=limit, started=time.monotonic() - elapsed)
    assert not clock.spent()  # nothing ran yet: the first unit always starts
    clock.worked = True
    # the clock moves on between the two reads: compare with what was true at construction
    if elapsed >= limit * SHARE:
        assert clock.spent() and clock.left() == 0
    else:
        assert clock.left() <= limit * SHARE - elapsed + 1e-6


def test_only_a_delivery_is_stopped_by_celery_s_soft_time_limit() -> None:
    clock = TimeSlice(limit=2)
    assert stops_delivery(clock, SoftTimeLimitExceeded())
    assert stops_delivery(clock, DeliveryTimeUp())
    assert stops_delivery(None, DeliveryTimeUp())
    # in the caller's process (no slice) it is an error like any other
    assert not stops_delivery(None, SoftTimeLimitExceeded())
    assert not stops_delivery(clock, ValueError("boom"))
