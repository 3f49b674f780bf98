"""Durations and counts a script keeps exact are checked where they are given
(``reactor_app.bounds``).

Before, a declaration out of that range was accepted and failed its work at every admission:
``ttl=float("inf")`` with ``OverflowError``, ``ttl=1e20`` and ``limit=10**30`` with Redis's
"value is not an integer or out of range" naming a script line. The properties below generate
numbers on both sides of each bound (and the non-numbers between) for every option that
reaches a script; the runs at the bounds go through the real scripts on the real Redis, so the
bounds are ones the scripts honour, not only ones the decorators say.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_step,
    interrupt,
    step,
    with_debounce,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.bounds import LARGEST_COUNT, LONGEST_SECONDS, SHORTEST_SECONDS
from reactor_app.conf import reactor_settings
from reactor_app.coordination import live_limits, rate_limit
from reactor_app.exceptions import (
    ConfigurationError,
    DefinitionError,
    InputValidationError,
    RateLimitExceeded,
)


def key(args: Any) -> str:
    return "bounds"


class Noop(Step):
    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(None)


#: every option that reaches a script as a duration, as a decorator given that value
DURATIONS: dict[str, Callable[[Any], Any]] = {
    "with_lock ttl": lambda v: with_lock(key, ttl=v),
    "with_semaphore ttl": lambda v: with_semaphore(key, limit=1, ttl=v),
    "with_period ttl": lambda v: with_period(key, ttl=v),
    "with_ordered_lock ttl": lambda v: with_ordered_lock(key, ttl=v),
    "with_ordered_lock poison_pill_timeout": lambda v: with_ordered_lock(
        key, poison_pill_timeout=v
    ),
    "with_debounce seconds": lambda v: with_debounce(key, v),
    "with_debounce max_wait": lambda v: with_debounce(key, 1, max_wait=v),
    "with_rate_limit period": lambda v: with_rate_limit(key, limit=1, period=v),
    # kept in the execution's state and added to a time (an infinite one failed the checkpoint)
    "async_step result_timeout": lambda v: async_step(Noop, result_timeout=v),
    "interrupt timeout": lambda v: interrupt(correlation_id=key, timeout=v),
}

#: options whose None means "not set" (no cap on a burst's wait)
NONE_MEANS_UNSET = {"with_debounce max_wait", "interrupt timeout"}

#: every option that reaches a script as a count
COUNTS: dict[str, Callable[[Any], Any]] = {
    "with_semaphore limit": lambda v: with_semaphore(key, limit=v),
    "with_rate_limit limit": lambda v: with_rate_limit(key, limit=v, period="second"),
    "with_rate_limit limits": lambda v: with_rate_limit(key, limits={"second": v, "hour": v}),
    "with_rate_limit cost": lambda v: with_rate_limit(
        key, limit=LARGEST_COUNT, period="second", cost=v
    ),
}

#: numbers around both bounds, the non-finite ones, and things that are not numbers
around_durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=SHORTEST_SECONDS * 2),
    st.floats(min_value=LONGEST_SECONDS / 2, max_value=LONGEST_SECONDS * 2),
    st.integers(min_value=-10, max_value=10**20),
    st.sampled_from([SHORTEST_SECONDS, LONGEST_SECONDS, math.nextafter(LONGEST_SECONDS, math.inf)]),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
around_counts = st.one_of(
    st.integers(min_value=-(10**3), max_value=10**31),
    st.integers(min_value=LARGEST_COUNT - 3, max_value=LARGEST_COUNT + 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)


def accepted(decorator: Callable[[Any], Any], value: Any) -> bool:
    try:
        decorator(value)
    except DefinitionError:
        return False
    return True


def in_duration_range(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and SHORTEST_SECONDS <= value <= LONGEST_SECONDS
    )


@pytest.mark.parametrize("option", sorted(DURATIONS))
@given(value=around_durations)
def test_a_duration_is_accepted_exactly_within_the_bounds(option: str, value: Any) -> None:
    expected = in_duration_range(value) or (value is None and option in NONE_MEANS_UNSET)
    assert accepted(DURATIONS[option], value) == expected, value


@given(
    every=st.one_of(
        st.integers(min_value=-10, max_value=10**31),
        st.integers(min_value=int(LONGEST_SECONDS) - 3, max_value=int(LONGEST_SECONDS) + 3),
        st.floats(allow_nan=True, allow_infinity=True),
    )
)
def test_a_period_bucket_is_accepted_exactly_within_the_bounds(every: Any) -> None:
    whole = isinstance(every, int) or (isinstance(every, float) and every.is_integer())
    within = whole and 1 <= every <= LONGEST_SECONDS
    assert accepted(lambda v: with_period(key, every=v), every) == within, every


@pytest.mark.parametrize("option", sorted(COUNTS))
@given(value=around_counts)
def test_a_count_is_accepted_exactly_within_the_bounds(option: str, value: Any) -> None:
    within = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= LARGEST_COUNT
    assert accepted(COUNTS[option], value) == within, value


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: with_lock(key, ttl=float("inf")), "ttl must be a number of seconds from 0.001"),
        (lambda: with_lock(key, ttl=1e20), "ttl must be a number of seconds from 0.001"),
        (lambda: with_lock(key, ttl=1e-9), "ttl must be a number of seconds from 0.001"),
        (
            lambda: with_ordered_lock(key, ttl=float("inf")),
            "ttl must be a number of seconds from 0.001",
        ),
        (lambda: with_semaphore(key, limit=10**30), "limit must be a positive integer no larger"),
        (lambda: with_period(key, every=10**16), "every=10000000000000000\\) must be a whole"),
        (
            lambda: with_rate_limit(key, limit=5, period=10**15),
            "a rate-limit period must be a number of seconds from 0.001",
        ),
    ],
    ids=[
        "lock-ttl-inf",
        "lock-ttl-1e20",
        "lock-ttl-1e-9",
        "ordered-ttl-inf",
        "limit-1e30",
        "period-bucket-1e16s",
        "window-1e15s",
    ],
)
def test_regression_declarations_that_failed_every_admission_fail_at_import(
    make: Callable[[], Any], says: str
) -> None:
    """Each of these was accepted, then failed its work at every admission (an
    ``OverflowError``, or a ``ResponseError`` naming a script line), or — a lease of 1 ns —
    was rounded up to a 1 ms lease already lost when the body began, or — a period's bucket of
    10**16 s — let the work run on every call instead of once."""
    with pytest.raises(DefinitionError, match=says) as raised:
        make()
    assert "100 years" in str(raised.value) or "10**15" in str(raised.value)


def test_an_infinite_wait_is_still_a_wait_without_end() -> None:
    """Waits never reach a script: they stay unbounded (only negative and NaN are refused)."""
    assert with_lock(key, wait=float("inf")) is not None
    assert with_semaphore(key, limit=1, rollback_wait=float("inf")) is not None
    with pytest.raises(DefinitionError, match="wait must be a number of seconds >= 0"):
        with_lock(key, wait=float("nan"))


@pytest.mark.django_db
def test_work_declared_at_the_bounds_is_admitted_by_the_scripts() -> None:
    """Every primitive at its largest duration and count, through the real scripts: admitted,
    released, and the count read back whole in a refusal."""
    longest = LONGEST_SECONDS

    @with_ordered_lock(lambda args: "bounds:ordered", ttl=longest, poison_pill_timeout=longest)
    @with_lock(lambda args: "bounds:lock", ttl=longest)
    @with_semaphore(lambda args: "bounds:semaphore", limit=LARGEST_COUNT, ttl=longest)
    @with_period(lambda args: f"bounds:period:{args['n']}", every="year", ttl=longest)
    @with_rate_limit(
        lambda args: "bounds:rate",
        limits={"second": LARGEST_COUNT, longest: LARGEST_COUNT},
        cost=LARGEST_COUNT,
    )
    class AtTheBounds(Step):
        inputs = ("n",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(args["n"])

    first = AtTheBounds.call(n=1)
    assert first.ok and first.value == 1, first.error
    second = AtTheBounds.call(n=2)  # the whole budget of the long window is spent
    assert isinstance(second.error, RateLimitExceeded), second.error
    assert second.error.limit == LARGEST_COUNT and type(second.error.limit) is int
    assert f"allows {LARGEST_COUNT} per" in second.error.message

    @with_lock(lambda args: "bounds:fixed", ttl=longest)
    @with_rate_limit(
        lambda args: "bounds:fixed", limit=LARGEST_COUNT, period=longest, strategy="fixed"
    )
    class FixedAtTheBounds(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("fixed")

    assert FixedAtTheBounds.call().ok


def test_settings_beyond_the_bounds_are_configuration_errors() -> None:
    too_many = {"limit": LARGEST_COUNT + 1, "period": "second"}
    with (
        override_settings(REACTOR_LIMITS={"huge": {"limit": LARGEST_COUNT + 1}}),
        pytest.raises(ConfigurationError, match=r"no larger than 10\*\*15"),
    ):
        live_limits.configured_semaphore_limit("huge")
    with (
        override_settings(REACTOR_RATE_LIMITS={"huge": too_many}),
        pytest.raises(ConfigurationError, match=r"no larger than 10\*\*15"),
    ):
        rate_limit.named_windows("huge", live=False)
    with (
        override_settings(REACTOR_RATE_LIMITS={"long": {"limit": 5, "period": 1e12}}),
        pytest.raises(ConfigurationError, match="100 years"),
    ):
        rate_limit.named_windows("long", live=False)
    for claim_ttl in (float("inf"), float("nan"), True, 1e12):
        with (
            override_settings(REACTOR_EXECUTION_CLAIM_TTL=claim_ttl),
            pytest.raises(ConfigurationError, match="REACTOR_EXECUTION_CLAIM_TTL"),
        ):
            _ = reactor_settings.EXECUTION_CLAIM_TTL


class Debounced(Reactor):
    only = step(Noop)


@pytest.mark.django_db
@pytest.mark.parametrize("seconds", [float("inf"), 1e20, float("nan"), 0.0001])
def test_a_debounce_option_beyond_the_bounds_is_an_input_error(seconds: float) -> None:
    with pytest.raises(InputValidationError, match=r"seconds from 0\.001 to"):
        Debounced.run_async(debounce=("bounds", seconds))
