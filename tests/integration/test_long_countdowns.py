"""A countdown longer than ``REACTOR_LONGEST_COUNTDOWN`` is sent in hops, so no worker holds a
message longer than a broker allows (``engine.countdowns``).

Before, a ``run_after`` (the task backend) or a debounce due in two hours was sent with a
two-hour countdown: a worker holds such a message unacknowledged until it is due, which
RabbitMQ answers after its ``consumer_timeout`` (30 minutes) by closing the channel — the
Celery worker stops with an unrecoverable ``PreconditionFailed`` — and the Redis transport by
handing the message to another worker every ``visibility_timeout``.

The messages are read back from a queue nobody consumes; a hop is the task's body run here on
the message's own headers (``run_execution.apply``: the body, not a worker), and the
real-worker test is in ``tests/worker/test_tasks_backend.py``.
"""

from __future__ import annotations

import ast
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import current_app
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reactor_app import Reactor, from_input, step, with_rate_limit
from reactor_app.engine.countdowns import DUE_HEADER, PRIORITY_HEADER
from reactor_app.engine.enqueueing import START_HEADER
from reactor_app.engine.priority import celery_priority
from reactor_app.models import Execution
from reactor_app.status import ExecutionStatus
from reactor_app.tasks import run_execution
from tests.integration.echo import Echo, EchoReactor
from tests.worker import task_functions as tasks

pytestmark = pytest.mark.django_db(transaction=True)

LONGEST = 60.0


@pytest.fixture
def nobody_queue(nobody_queue: str, settings: Any) -> str:
    settings.REACTOR_LONGEST_COUNTDOWN = LONGEST
    return nobody_queue


def taken(queue: str) -> list[dict[str, Any]]:
    """The headers of the messages waiting in ``queue``, consumed (nobody else reads it), with
    each one's priority, its countdown from now (its ETA), in seconds, and the task's keyword
    arguments (``kwargs``: a park's requeue names its ``requeue_token`` there)."""
    found = []
    with current_app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            headers = dict(message.headers)
            eta = headers.get("eta")
            headers["countdown"] = (
                (datetime.fromisoformat(eta) - datetime.now(UTC)).total_seconds() if eta else 0.0
            )
            headers["priority"] = message.properties.get("priority")
            headers["kwargs"] = message.decode()[1]
            found.append(headers)
    return found


def hop(message: dict[str, Any], execution_id: str) -> Any:
    """What a worker does with ``message`` once it arrives: the task's body on its headers."""
    custom = (DUE_HEADER, PRIORITY_HEADER, START_HEADER)
    headers = {name: message[name] for name in custom if name in message}
    return run_execution.apply(args=[execution_id], headers=headers).get()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    due_in=st.one_of(
        st.floats(min_value=1.0, max_value=LONGEST * 3),
        st.floats(min_value=LONGEST, max_value=100 * 365 * 86400.0),
    ),
    priority=st.sampled_from([0, 40, -100, 100]),
)
@example(due_in=LONGEST - 1, priority=0)
@example(due_in=2 * 3600.0, priority=40)
def test_no_message_waits_longer_than_the_longest_countdown_and_a_hop_keeps_the_due_time(
    nobody_queue: str, due_in: float, priority: int
) -> None:
    due = datetime.now(UTC) + timedelta(seconds=due_in)
    result = tasks.add.using(run_after=due, priority=priority).enqueue(1)
    [first] = taken(nobody_queue)
    assert first["countdown"] <= LONGEST + 0.5
    if DUE_HEADER not in first:
        assert due_in <= LONGEST + 0.5  # only a countdown a broker holds goes as it is
        assert first["countdown"] == pytest.approx(due_in, abs=1.0)
        return
    assert due_in > LONGEST - 0.5
    assert first[DUE_HEADER] == pytest.approx(due.timestamp(), abs=1.0)
    if priority:  # (the default priority sends none)
        assert first["priority"] == first[PRIORITY_HEADER] == celery_priority(priority)
    else:
        assert PRIORITY_HEADER not in first

    summary = hop(first, result.id)  # arrives early: sent on, nothing else
    assert summary["outcome"] == "deferred"
    row = Execution.objects.get(pk=result.id)
    assert (row.status, row.claim_generation, row.started_at) == (ExecutionStatus.PENDING, 0, None)
    [second] = taken(nobody_queue)
    assert second["countdown"] <= LONGEST + 0.5
    assert second[START_HEADER] == first[START_HEADER] == "call"
    assert second["priority"] == first["priority"]
    remaining = first[DUE_HEADER] - time.time()
    if remaining > LONGEST + 1:
        assert second[DUE_HEADER] == pytest.approx(first[DUE_HEADER], abs=0.01)
    elif remaining < LONGEST - 1:
        assert DUE_HEADER not in second  # the last hop runs when it arrives
        assert second["countdown"] == pytest.approx(remaining, abs=1.0)


def test_a_message_whose_due_time_has_come_runs(nobody_queue: str) -> None:
    execution = EchoReactor.run_async(x=7)
    taken(nobody_queue)
    message = {DUE_HEADER: time.time() - 0.01, START_HEADER: "echo"}
    summary = hop(message, str(execution.id))
    assert summary.get("outcome") != "deferred", summary
    assert execution.wait(timeout=5).value == 7


@pytest.mark.parametrize("due", ["soon", float("nan"), True, None], ids=str)
def test_a_due_header_that_is_no_time_is_ignored(nobody_queue: str, due: Any) -> None:
    execution = EchoReactor.run_async(x=8)
    taken(nobody_queue)
    hop({DUE_HEADER: due, START_HEADER: "echo"}, str(execution.id))
    assert execution.wait(timeout=5).value == 8


def test_a_debounce_due_later_than_the_longest_countdown_is_sent_in_hops(
    nobody_queue: str,
) -> None:
    burst = f"burst-{uuid.uuid4().hex[:8]}"
    execution = EchoReactor.run_async(x=9, debounce=(burst, 2 * LONGEST))
    [first] = taken(nobody_queue)
    assert first["countdown"] <= LONGEST + 0.5
    assert first[DUE_HEADER] == pytest.approx(time.time() + 2 * LONGEST, abs=2.0)
    assert hop(first, str(execution.id))["outcome"] == "deferred"
    assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PENDING
    [second] = taken(nobody_queue)
    assert second[DUE_HEADER] == pytest.approx(first[DUE_HEADER], abs=0.01)


@with_rate_limit(lambda inputs: f"hops:{inputs['x']}", limit=1, period=3 * LONGEST)
class Metered(Reactor):
    inputs = ("x",)
    echo = step(Echo, x=from_input("x"))


def test_a_park_until_a_long_window_frees_a_slot_is_sent_in_hops(
    nobody_queue: str, settings: Any
) -> None:
    """A rate limit's refusal parks the execution until its window frees a slot: for a window
    of hours that was the requeue's countdown, held by a worker the whole time."""
    settings.REACTOR_WORKER_WAIT = 0
    key = uuid.uuid4().hex[:8]
    first, second = Metered.run_async(x=key), Metered.run_async(x=key)
    taken(nobody_queue)
    assert hop({START_HEADER: "echo"}, str(first.id))["status"] == ExecutionStatus.SUCCEEDED
    assert hop({START_HEADER: "echo"}, str(second.id))["status"] == ExecutionStatus.PARKED
    [requeue] = taken(nobody_queue)
    assert requeue["countdown"] <= LONGEST + 0.5
    assert requeue[DUE_HEADER] == pytest.approx(time.time() + 3 * LONGEST, abs=5.0)
    token = requeue["kwargsrepr"]
    assert "requeue_token" in token
    # the early delivery sends the park's own requeue on, token and all, and nothing else
    summary = run_execution.apply(
        args=[str(second.id)],
        kwargs=ast.literal_eval(token),  # Celery's repr of the message's kwargs
        headers={DUE_HEADER: requeue[DUE_HEADER]},
    ).get()
    assert summary["outcome"] == "deferred"
    [again] = taken(nobody_queue)
    assert again["kwargsrepr"] == token
    assert again[DUE_HEADER] == pytest.approx(requeue[DUE_HEADER], abs=0.01)
    assert Execution.objects.get(pk=second.pk).status == ExecutionStatus.PARKED


def test_regression_a_priority_header_of_0_is_read_from_a_workers_request() -> None:
    """A worker's request carries custom headers as attributes (and ``headers`` None): the
    lowest priority on Celery's scale, 0, was read as no priority by an ``or``, so the next hop
    went at the default priority."""
    from types import SimpleNamespace

    from reactor_app.tasks import _header

    on_a_worker = SimpleNamespace(headers=None, **{PRIORITY_HEADER: 0})
    assert _header(on_a_worker, PRIORITY_HEADER) == 0
    applied = SimpleNamespace(headers={PRIORITY_HEADER: 0})  # an eager ``apply``
    assert _header(applied, PRIORITY_HEADER) == 0
    assert _header(SimpleNamespace(headers=None), PRIORITY_HEADER) is None
