"""The per-key timeline: how CoordinationEvents become hold bars, park bars and marks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reactor_app import timeline
from reactor_app.models import CoordinationEvent
from reactor_app.status import CoordinationEventKind as Kind

END = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
START = END - timedelta(minutes=60)


def event(kind: str, minute: float, owner: str = "exec-a", step: str = "charge", **extra: Any):
    return CoordinationEvent(
        kind=kind,
        primitive=extra.pop("primitive", "lock"),
        key="acct:1",
        owner=owner,
        step=step,
        token=extra.pop("token", None),
        at=START + timedelta(minutes=minute),
        detail=extra,
    )


def build(*events: CoordinationEvent) -> timeline.Timeline:
    return timeline.build("acct:1", START, END, events)


def test_reentrant_holds_make_one_bar_from_outermost_acquire_to_outermost_release() -> None:
    drawn = build(
        event(Kind.ACQUIRED, 10, token=7),
        event(Kind.ACQUIRED, 11, reentrant=True),
        event(Kind.RELEASED, 12),
        event(Kind.RELEASED, 20),
    )
    (bar,) = drawn.bars
    assert (bar.kind, bar.start, bar.end, bar.token) == (
        "hold",
        START + timedelta(minutes=10),
        START + timedelta(minutes=20),
        7,
    )


def test_step_level_and_reactor_level_holds_get_their_own_lanes() -> None:
    drawn = build(
        event(Kind.ACQUIRED, 5, step=""),
        event(Kind.ACQUIRED, 6, step="charge"),
        event(Kind.RELEASED, 7, step="charge"),
        event(Kind.RELEASED, 8, step=""),
    )
    assert [(lane.level, lane.step) for lane in drawn.lanes] == [
        ("reactor", ""),
        ("step", "charge"),
    ]
    assert [bar.lane.level for bar in drawn.bars] == ["reactor", "step"]


def test_forced_release_ends_the_hold_and_is_marked() -> None:
    drawn = build(
        event(Kind.ACQUIRED, 10),
        event(Kind.FORCED_RELEASE, 15, by="operator"),
        event(Kind.LEASE_LOST, 16),
        event(Kind.RELEASED, 17),
    )
    (bar,) = drawn.bars
    assert bar.end == START + timedelta(minutes=15) and bar.ended_by == Kind.FORCED_RELEASE
    assert [m.kind for m in drawn.marks] == [Kind.FORCED_RELEASE, Kind.LEASE_LOST]


def test_a_failed_release_ends_the_bar_where_its_owner_let_go_and_is_marked() -> None:
    drawn = build(
        event(Kind.ACQUIRED, 10),
        event(Kind.RELEASE_FAILED, 12, outcome="success", cause="Redis unreachable"),
    )
    (bar,) = drawn.bars
    assert bar.end == START + timedelta(minutes=12) and bar.ended_by == Kind.RELEASE_FAILED
    (mark,) = drawn.marks
    assert mark.kind == Kind.RELEASE_FAILED and mark.detail["cause"] == "Redis unreachable"
    svg = timeline.render_svg(drawn)
    assert 'class="mark release_failed"' in svg and "Redis unreachable" in svg


def test_parks_run_until_the_lane_moves_on_and_open_ones_reach_the_end() -> None:
    drawn = build(
        event(Kind.ACQUIRED, 1, owner="holder"),
        event(Kind.ACQUISITION_FAILED, 2, owner="waiter"),
        event(Kind.PARKED, 2, owner="waiter"),
        event(Kind.ACQUISITION_FAILED, 4, owner="waiter"),
        event(Kind.PARKED, 4, owner="waiter"),
        event(Kind.RELEASED, 9, owner="holder"),
        event(Kind.RESUMED, 9.5, owner="waiter"),
        event(Kind.ACQUIRED, 9.5, owner="waiter"),
        event(Kind.PARKED, 50, owner="late"),
    )
    parks = [b for b in drawn.bars if b.kind == "park"]
    assert [(p.lane.owner, p.start, p.end) for p in parks] == [
        ("waiter", START + timedelta(minutes=2), START + timedelta(minutes=9.5)),
        ("late", START + timedelta(minutes=50), None),
    ]
    holds = {b.lane.owner: b for b in drawn.bars if b.kind == "hold"}
    assert holds["waiter"].end is None  # still held: open to the right edge
    assert [m.kind for m in drawn.marks] == [Kind.ACQUISITION_FAILED] * 2


def test_holds_started_before_the_window_are_clipped_not_lost() -> None:
    before = event(Kind.ACQUIRED, -30)
    assert before.at < START
    drawn = build(before, event(Kind.RELEASED, 5))
    (bar,) = drawn.bars
    assert bar.start < START and bar.end == START + timedelta(minutes=5)
    svg = timeline.render_svg(drawn)
    assert 'class="bar hold"' in svg
    assert build(event(Kind.ACQUIRED, -30), event(Kind.RELEASED, -20)).bars == []


def test_render_escapes_every_text() -> None:
    hostile = CoordinationEvent(
        kind=Kind.ACQUIRED,
        primitive="lock",
        key="<script>alert(1)</script>",
        owner='"><img src=x>',
        step="<b>",
        at=START + timedelta(minutes=1),
        detail={},
    )
    svg = timeline.render_svg(timeline.build(hostile.key, START, END, [hostile]))
    assert "<script>" not in svg and "<img" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg


@pytest.mark.django_db
def test_for_key_reads_the_event_table() -> None:
    now = datetime.now(UTC)
    for kind, ago in ((Kind.ACQUIRED, 10), (Kind.RELEASED, 5)):
        CoordinationEvent.objects.create(
            kind=kind,
            primitive="lock",
            key="acct:2",
            owner="o",
            step="s",
            at=now - timedelta(minutes=ago),
        )
    drawn = timeline.for_key("acct:2", minutes=15, now=now)
    assert drawn.events == 2 and len(drawn.bars) == 1
    assert timeline.for_key("acct:2", minutes=1, now=now).bars == []


#: zones whose offsets are not whole hours (India, Nepal, Newfoundland), one with daylight
#: saving time, and UTC
TICK_ZONES = ["Asia/Kolkata", "Asia/Kathmandu", "America/St_Johns", "Europe/Berlin", "UTC"]


@settings(max_examples=200, deadline=None)
@given(
    zone=st.sampled_from(TICK_ZONES),
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1)),
    span=st.integers(min_value=60, max_value=40 * 86400),
)
def test_the_timeline_s_ticks_are_round_on_the_clock_they_are_shown_in(
    zone: str, start: datetime, span: int
) -> None:
    """Ticks are round times of the wall clock their labels show: in Kolkata hourly ticks read
    15:00, 16:00 (rounded in UTC, they read 15:30, 16:30), and at most ten cross the window.
    Windows with a change of the zone's offset inside are left out: there a tick's wall clock
    moves with the change."""
    with timezone.override(ZoneInfo(zone)):
        begin = start.replace(tzinfo=UTC)
        end = begin + timedelta(seconds=span)
        assume(
            timezone.localtime(begin).utcoffset() == timezone.localtime(end).utcoffset()
            and all(
                timezone.localtime(begin + timedelta(days=d)).utcoffset()
                == timezone.localtime(begin).utcoffset()
                for d in range(span // 86400 + 1)
            )
        )
        ticks = timeline._ticks(begin, end)
        assert 1 <= len(ticks) <= 10
        assert all(begin < tick <= end for tick in ticks)
        step = (ticks[1] - ticks[0]).total_seconds() if len(ticks) > 1 else None
        for tick in ticks:
            shown = timezone.localtime(tick)
            since_midnight = shown.hour * 3600 + shown.minute * 60 + shown.second
            assert shown.microsecond == 0
            if step is not None:
                assert since_midnight % min(step, 86400) == 0, (shown, step)
