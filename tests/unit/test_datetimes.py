"""``reactor_app.datetimes``: every moment the app makes or takes is of the project's kind.

A project with ``USE_TZ = True`` keeps aware datetimes; one with ``USE_TZ = False`` keeps naive
local time (``TIME_ZONE``). The properties: a moment made from epoch seconds is of the
project's kind and names the same instant; shown, it reads as the wall clock of ``TIME_ZONE``;
a caller's datetime comes back of the project's kind and the same instant, or is refused with
an ``InputValidationError`` that names it — never a ``TypeError`` from a comparison later.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.utils import timezone as django_timezone
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reactor_app import datetimes
from reactor_app.exceptions import InputValidationError

#: zones with a whole-hour offset, a half-hour one, a 45-minute one, and daylight saving time
ZONES = ("UTC", "Asia/Kolkata", "Pacific/Chatham", "America/New_York", "Europe/Berlin")

#: epoch seconds from 1970 to 2100, to the microsecond
EPOCHS = st.integers(min_value=0, max_value=4_102_444_800 * 10**6).map(lambda us: us / 10**6)

#: a caller's datetimes: aware in any zone or fixed offset, naive, far and near
AWARE = st.one_of(
    st.datetimes(timezones=st.timezones()),
    st.datetimes(
        timezones=st.integers(min_value=-23 * 60 + 1, max_value=23 * 60 - 1).map(
            lambda minutes: timezone(timedelta(minutes=minutes))
        )
    ),
)
NAIVE = st.datetimes()
NOT_DATETIMES = st.one_of(
    st.text(max_size=30), st.integers(), st.floats(), st.dates(), st.times(), st.none()
)


def _wall_clock(seconds: float, zone: str) -> datetime:
    """The wall clock of ``zone`` at ``seconds``, computed apart from the code under test."""
    return datetime.fromtimestamp(seconds, ZoneInfo(zone)).replace(tzinfo=None)


@settings(max_examples=150, deadline=None)
@given(seconds=EPOCHS, zone=st.sampled_from(ZONES), use_tz=st.booleans())
@example(seconds=1_699_164_000.0, zone="America/New_York", use_tz=False)  # the DST fold, 2023
def test_a_moment_of_epoch_seconds_is_of_the_projects_kind_and_reads_as_its_wall_clock(
    seconds: float, zone: str, use_tz: bool
) -> None:
    with override_settings(USE_TZ=use_tz, TIME_ZONE=zone):
        moment = datetimes.from_epoch(seconds)
        assert django_timezone.is_aware(moment) is use_tz
        assert abs(moment.timestamp() - seconds) < 1e-6
        shown = datetimes.on_screen(moment)
        assert shown.replace(tzinfo=None) == _wall_clock(seconds, zone)
        # and the project's own clock is of the same kind: the two compare
        assert isinstance(django_timezone.now() - moment, timedelta)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(AWARE, NAIVE), zone=st.sampled_from(ZONES), use_tz=st.booleans())
@example(value=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), zone="UTC", use_tz=False)
@example(value=datetime(9999, 12, 31, 23, tzinfo=UTC), zone="Asia/Kolkata", use_tz=False)
def test_a_callers_datetime_is_taken_as_the_same_instant_of_the_projects_kind_or_refused(
    value: datetime, zone: str, use_tz: bool
) -> None:
    with override_settings(USE_TZ=use_tz, TIME_ZONE=zone):
        aware = django_timezone.is_aware(value)
        try:
            taken = datetimes.given(value, name="run_after", reactor="a.Reactor")
        except InputValidationError as refused:
            assert refused.field_errors is not None and "run_after" in refused.field_errors
            assert refused.reactor == "a.Reactor"
            if use_tz:
                assert not aware  # only a naive one is refused with USE_TZ
                assert "aware" in refused.message
            else:
                # only an instant with no local time in the zone's range of years
                assert aware and value.year in (1, 9999)
            return
        assert django_timezone.is_aware(taken) is use_tz
        if use_tz or not aware:
            assert taken is value
        else:
            # the same instant, as the local wall clock
            assert taken == value.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        # comparable with the project's clock: what run_async does with it next
        assert isinstance(django_timezone.now() - taken, timedelta)


@settings(max_examples=60, deadline=None)
@given(value=NOT_DATETIMES, use_tz=st.booleans())
def test_anything_but_a_datetime_is_refused_by_name(value: Any, use_tz: bool) -> None:
    with override_settings(USE_TZ=use_tz), pytest.raises(InputValidationError) as refused:
        datetimes.given(value, name="run_after")
    assert refused.value.field_errors == {"run_after": "not a datetime"}
    assert type(value).__name__ in refused.value.message


def test_regression_a_date_is_not_taken_for_a_datetime() -> None:
    # a datetime is a date, not the other way round: a date names no instant
    with pytest.raises(InputValidationError, match="not date"):
        datetimes.given(date(2030, 1, 1), name="run_after")
