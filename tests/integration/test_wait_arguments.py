"""``Execution.wait(timeout, poll_interval)`` checks its arguments before it reads the row, and
never sleeps past its deadline (``engine.result.wait_for``).

Before: a NaN ``timeout`` waited without end (no time is past NaN); a negative, NaN or
infinite ``poll_interval`` raised ``time.sleep``'s own ``ValueError`` / ``OverflowError`` after
a first read, a ``poll_interval`` of 0 read the row in a busy loop, a ``timeout`` given as text
raised a ``TypeError`` from the arithmetic; and a ``poll_interval`` longer than the
``timeout`` slept all of it, so ``wait(timeout=0.2, poll_interval=30)`` took 30 s to time out.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reactor_app.exceptions import InputValidationError
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from tests.integration.echo import EchoReactor

pytestmark = pytest.mark.django_db(transaction=True)


#: anything a caller might pass: numbers of every sign and size, the float specials, and
#: values of other types
arguments = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 0.0, -0.0, 5e-324, True, False, None, "1", b"1", [1]]),
)


def is_number(value: Any) -> bool:
    return type(value) in (int, float)


def timeout_ok(value: Any) -> bool:
    return is_number(value) and not math.isnan(value) and value >= 0


def interval_ok(value: Any) -> bool:
    return is_number(value) and math.isfinite(value) and value > 0


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(timeout=arguments, poll_interval=arguments)
def test_wait_refuses_out_of_range_arguments_before_reading_and_takes_the_rest(
    finished: Execution, timeout: Any, poll_interval: Any
) -> None:
    """On a finished execution a wait with good arguments returns after one read whatever
    they are (an infinite timeout included); bad ones are refused by name before any read."""
    bad = {
        name
        for name, good in (
            ("timeout", timeout_ok(timeout)),
            ("poll_interval", interval_ok(poll_interval)),
        )
        if not good
    }
    with CaptureQueriesContext(connection) as queries:
        if bad:
            with pytest.raises(InputValidationError) as raised:
                finished.wait(timeout=timeout, poll_interval=poll_interval)
        else:
            result = finished.wait(timeout=timeout, poll_interval=poll_interval)
    if bad:
        assert set(raised.value.field_errors or {}) == bad, raised.value.field_errors
        assert all(f"{name} must be" in str(raised.value) for name in bad), str(raised.value)
        assert queries.captured_queries == []  # refused before the row was read
    else:
        assert result.ok and result.value == "done"
        assert len(queries.captured_queries) == 1


@pytest.fixture
def finished(db: Any) -> Execution:
    result = EchoReactor.run(x="done")
    assert result.ok
    return Execution.objects.get(pk=result.execution_id)


@pytest.mark.parametrize("timeout", [math.nan, -1, "1"], ids=["nan", "negative", "text"])
def test_regression_a_bad_timeout_is_refused_at_once_on_a_pending_execution(
    nobody_queue: str, timeout: Any
) -> None:
    """A NaN timeout used to wait without end on a pending execution nobody runs."""
    execution = EchoReactor.run_async(x=1)
    started = time.monotonic()
    with pytest.raises(InputValidationError, match="timeout must be"):
        execution.wait(timeout=timeout, poll_interval=0.01)
    assert time.monotonic() - started < 1.0
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.PENDING


@pytest.mark.parametrize(
    "poll_interval", [-1, math.nan, math.inf, 0], ids=["negative", "nan", "inf", "zero"]
)
def test_regression_a_bad_poll_interval_is_refused_with_a_structured_error(
    nobody_queue: str, poll_interval: Any
) -> None:
    execution = EchoReactor.run_async(x=1)
    with pytest.raises(InputValidationError, match="poll_interval must be") as raised:
        execution.wait(timeout=0.1, poll_interval=poll_interval)
    assert set(raised.value.field_errors or {}) == {"poll_interval"}


def test_regression_a_long_poll_interval_does_not_sleep_past_the_timeout(
    nobody_queue: str,
) -> None:
    """``wait(timeout=0.2, poll_interval=30)`` slept the whole 30 s before it timed out."""
    execution = EchoReactor.run_async(x=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"still pending after 0\.2s"):
        execution.wait(timeout=0.2, poll_interval=30)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 5.0, elapsed


def test_regression_a_wait_on_a_deferred_execution_says_when_it_is_due(
    nobody_queue: str,
) -> None:
    """A wait that timed out on a run not due yet (a debounce's quiet period, a task's
    ``run_after``) blamed a missing worker: "no worker has taken it from the Celery queue"."""
    burst = f"deferred-{uuid.uuid4().hex[:8]}"
    execution = EchoReactor.run_async(x=1, debounce=(burst, 3600))
    due = Execution.objects.get(pk=execution.pk).heartbeat_at
    with pytest.raises(TimeoutError) as raised:
        execution.wait(timeout=0.1)
    message = str(raised.value)
    assert f"not due before {due:%Y-%m-%d %H:%M:%S} UTC" in message, message
    assert "no worker has taken it" not in message
    # one due now is blamed on the missing worker, as before
    now = EchoReactor.run_async(x=2)
    with pytest.raises(TimeoutError, match="no worker has taken it"):
        now.wait(timeout=0.1)
