"""Live limits on real Redis (one server and a 3-master cluster): an operator's override of a
named limit reaches another process within 1 s, at step and reactor level, and removing it
restores the settings value. Running Celery workers: tests/worker/test_live_limits.py."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
from django.db import connections
from hypothesis import given
from hypothesis import strategies as st

from reactor_app import Reactor, Step, Success, step, with_rate_limit, with_semaphore
from reactor_app.coordination import live_limits
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, Refused, SemaphoreClaim
from reactor_app.coordination.rate_limit import named_claim, named_windows
from reactor_app.exceptions import ConfigurationError, SemaphoreAcquisitionError
from reactor_app.operator import limits

pytestmark = pytest.mark.django_db(transaction=True)

#: the promise (docs/coordination.md, "Live limits")
WITHIN_NS = 1_000_000_000


@pytest.fixture(autouse=True)
def named(settings: Any, reactor_redis: Any) -> None:
    settings.REACTOR_LIMITS = {"live": {"limit": 1}}
    settings.REACTOR_RATE_LIMITS = {
        "sms": {"limit": 10, "period": "minute"},
        "live_rate": {"limit": 1, "period": "minute"},
    }
    live_limits.forget_copy()


def _claim(key: str) -> SemaphoreClaim:
    return SemaphoreClaim(key, limit=1, limit_name="live")


def _second_holder(key: str, refused: Any, admitted: Any) -> None:
    """In another process: try to take a second slot until it is admitted; say when."""
    coordinator = Coordinator()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        answer = coordinator.admit([_claim(key)], Holder(owner="second"))
        if isinstance(answer, Admitted):
            admitted.put(time.time_ns())
            coordinator.release(answer, "success")
            return
        assert isinstance(answer, Refused)
        refused.set()
        time.sleep(0.005)  # a retry loop is the subject: how soon a retry sees the new limit
    admitted.put(None)


def test_an_override_reaches_another_process_within_a_second(redis_topology: str) -> None:
    coordinator = Coordinator()
    first = coordinator.admit([_claim("acct")], Holder(owner="first"))
    assert isinstance(first, Admitted)
    context = multiprocessing.get_context("fork")
    refused, admitted = context.Event(), context.Queue()
    connections.close_all()
    child = context.Process(target=_second_holder, args=("acct", refused, admitted))
    child.start()
    try:
        assert refused.wait(20), "the other process was never refused at the settings limit"
        before = time.time_ns()
        limits.set_override("semaphore", "live", "2", by="ops", reason="test")
        at = admitted.get(timeout=20)
    finally:
        child.join(20)
    assert at is not None, "the other process never got the second slot"
    print(
        f"\n{redis_topology}: override -> admission in another process {(at - before) / 1e6:.0f} ms"
    )
    assert at - before < WITHIN_NS

    limits.remove_override("semaphore", "live", by="ops")
    assert isinstance(coordinator.admit([_claim("acct")], Holder(owner="third")), Refused)
    coordinator.release(first, "success")


def _charged_again(refused: Any, admitted: Any) -> None:
    """In another process: charge the named rate limit until it admits; say when."""
    coordinator = Coordinator()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        answer = coordinator.admit([named_claim("live_rate")], Holder(owner="again"))
        if isinstance(answer, Admitted):
            admitted.put(time.time_ns())
            return
        assert isinstance(answer, Refused)
        refused.set()
        time.sleep(0.005)
    admitted.put(None)


def test_a_rate_limit_override_reaches_another_process_within_a_second(
    redis_topology: str,
) -> None:
    first = Coordinator().admit([named_claim("live_rate")], Holder(owner="first"))
    assert isinstance(first, Admitted)  # the minute's one admission is spent
    context = multiprocessing.get_context("fork")
    refused, admitted = context.Event(), context.Queue()
    connections.close_all()
    child = context.Process(target=_charged_again, args=(refused, admitted))
    child.start()
    try:
        assert refused.wait(20), "the other process was never refused at the settings limit"
        before = time.time_ns()
        limits.set_override("rate_limit", "live_rate", "3/minute", by="ops")
        at = admitted.get(timeout=20)
    finally:
        child.join(20)
    assert at is not None, "the other process was never admitted under the raised limit"
    assert at - before < WITHIN_NS
    # the third of three in the minute, then refused; back to settings: refused at once
    assert isinstance(Coordinator().admit([named_claim("live_rate")], Holder(owner="x")), Admitted)
    assert isinstance(Coordinator().admit([named_claim("live_rate")], Holder(owner="y")), Refused)
    limits.remove_override("rate_limit", "live_rate", by="ops")
    assert named_windows("live_rate")[0].limit == 1


@with_semaphore(lambda args: "waited", limit="live", wait=15)
class Waiting(Step):
    inputs = ("admitted",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        args["admitted"].put(time.time_ns())
        return Success("ran")


@with_rate_limit("live_rate", wait=15)
class WaitingForRate(Step):
    inputs = ("admitted",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        args["admitted"].put(time.time_ns())
        return Success("ran")


def _waiting_caller(admitted: Any, unit: Any = Waiting, refused: Any = None) -> None:
    if refused is not None:  # tell the test when the caller has been refused (it waits then)
        admit = Coordinator.admit

        def telling(self: Coordinator, *args: Any, **kwargs: Any) -> Any:
            answer = admit(self, *args, **kwargs)
            if isinstance(answer, Refused):
                refused.set()
            return answer

        Coordinator.admit = telling  # type: ignore[method-assign]
    try:
        outcome = unit.call(admitted=admitted)
        assert outcome.ok, outcome
    except BaseException:
        admitted.put(None)
        raise
    finally:
        connections.close_all()


def test_a_caller_already_waiting_in_another_process_is_admitted_within_a_second() -> None:
    """No release announces a raised limit: a waiting caller looks again as often as its
    process's copy may change, not at the holder's lease end (``waiting.admit_waiting``)."""
    coordinator = Coordinator()
    held = coordinator.admit([_claim("waited")], Holder(owner="elsewhere"))
    assert isinstance(held, Admitted)
    context = multiprocessing.get_context("fork")
    admitted = context.Queue()
    connections.close_all()
    child = context.Process(target=_waiting_caller, args=(admitted,))
    child.start()
    try:
        deadline = time.monotonic() + 20
        while not coordinator.waiters(_claim("waited")):  # the caller queued: it waits now
            assert time.monotonic() < deadline, "the caller in the other process never waited"
            time.sleep(0.01)
        before = time.time_ns()
        limits.set_override("semaphore", "live", "2", by="ops")
        at = admitted.get(timeout=20)
    finally:
        child.join(20)
    assert at is not None, "the waiting caller failed"
    print(f"\noverride -> waiting caller admitted {(at - before) / 1e6:.0f} ms")
    assert at - before < WITHIN_NS
    coordinator.release(held, "success")


def test_a_caller_waiting_on_a_named_rate_limit_obeys_a_raise_within_a_second() -> None:
    """The waiting caller's claim was made under the old windows and its retry_after is the
    minute's end: each retry reads the windows again (``rate_limit.live_claim``)."""
    assert isinstance(Coordinator().admit([named_claim("live_rate")], Holder(owner="a")), Admitted)
    context = multiprocessing.get_context("fork")
    admitted, refused = context.Queue(), context.Event()
    connections.close_all()
    child = context.Process(target=_waiting_caller, args=(admitted, WaitingForRate, refused))
    child.start()
    try:
        assert refused.wait(20), "the caller in the other process was never refused"
        before = time.time_ns()
        limits.set_override("rate_limit", "live_rate", "2/minute", by="ops")
        at = admitted.get(timeout=20)
    finally:
        child.join(20)
    assert at is not None, "the waiting caller failed"
    assert at - before < WITHIN_NS


def test_a_step_and_a_reactor_obey_the_named_limit_in_process() -> None:
    class Body(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("ran")

    @with_semaphore(lambda args: "pool", limit="live")
    class Limited(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("ran")

    @with_semaphore(lambda inputs: "pool", limit="live")
    class Pooled(Reactor):
        work = step(Body)

    coordinator = Coordinator()
    held = coordinator.admit([_claim("pool")], Holder(owner="elsewhere"))
    assert isinstance(held, Admitted)
    assert isinstance(Limited.call().error, SemaphoreAcquisitionError)  # settings: 1
    assert not Pooled.run().ok

    limits.set_override("semaphore", "live", "2", by="ops")
    assert Limited.call() == Success("ran")
    assert Pooled.run().ok

    limits.remove_override("semaphore", "live", by="ops")
    assert isinstance(Limited.call().error, SemaphoreAcquisitionError)
    coordinator.release(held, "success")


def test_a_lowered_limit_keeps_the_line_in_order_and_wakes_nobody_for_nothing(
    redis_topology: str,
) -> None:
    """Found in review: lowered from 3 to 1 with three holders and three waiters, each
    release handed its slot to the head waiter although the slots still held were not under
    the new limit — the waiter, woken for nothing, was refused and queued again at the back,
    so the line ended C, A, B. A slot freed over the limit is now granted to nobody: the
    first grant goes to A once a slot is really free, and the line is served A, B, C."""
    limits.set_override("semaphore", "live", "3", by="ops")
    coordinator = Coordinator()
    claim = _claim("lowered")
    holding = [coordinator.admit([claim], Holder(owner=f"holder{n}")) for n in range(3)]
    assert all(isinstance(held, Admitted) for held in holding)
    limits.set_override("semaphore", "live", "1", by="ops")
    for waiter in ("A", "B", "C"):
        answer = coordinator.admit([claim], Holder(owner=waiter), waiter_id=waiter)
        assert isinstance(answer, Refused), answer

    # two slots still held, then one, the limit is one: nobody is granted a slot
    assert coordinator.release(holding.pop(0), "success").woken == []
    assert coordinator.release(holding.pop(0), "success").woken == []
    assert coordinator.waiters(claim) == ["A", "B", "C"]
    granted: list[str] = []
    while holding:
        for waiter in coordinator.release(holding.pop(0), "success").woken:
            granted.append(waiter)
            answer = coordinator.admit([claim], Holder(owner=waiter), waiter_id=waiter)
            assert isinstance(answer, Admitted), (waiter, answer)
            holding.append(answer)
    assert granted == ["A", "B", "C"]


def test_only_a_raised_semaphore_limit_wakes_the_executions_parked_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found in review: every change woke every execution parked on the limit, a lowered (or
    unchanged) one too. Woken with no slot for it, each was refused and parked again — and
    every park counts towards ``REACTOR_CONTENTION_CEILING`` (20), so an operator's changes
    alone could fail executions that were only waiting. (Who is woken is the subject here;
    that a woken execution runs on a worker: tests/worker/test_worker_live_limits.py.)"""
    from reactor_app.models import ContentionState, Execution
    from reactor_app.status import ExecutionStatus

    sent: list[str] = []
    monkeypatch.setattr(
        limits, "enqueue_quietly", lambda execution_id, **_: sent.append(execution_id)
    )
    # a reactor this process cannot load counts as using the limit (operator.limits.parked_on)
    parked = Execution.objects.start(
        reactor="tests.nowhere.Pooled", inputs={}, status=ExecutionStatus.PARKED
    )
    ContentionState.objects.create(
        execution=parked, step="", primitive="semaphore", key="pool", attempts=1
    )
    assert limits.set_override("semaphore", "live", "3", by="ops")["woken"] == [str(parked.pk)]
    assert sent == [str(parked.pk)]
    sent.clear()
    assert limits.set_override("semaphore", "live", "2", by="ops")["woken"] == []  # lowered
    assert limits.set_override("semaphore", "live", "2", by="ops")["woken"] == []  # the same
    assert limits.remove_override("semaphore", "live", by="ops")["woken"] == []  # 2 -> 1
    assert limits.set_override("semaphore", "live", "1", by="ops")["woken"] == []  # 1 -> 1
    assert sent == []
    assert limits.set_override("semaphore", "live", "4", by="ops")["woken"] == [str(parked.pk)]


def test_an_unknown_named_limit_fails_the_work_and_names_the_setting() -> None:
    @with_semaphore(lambda args: "pool", limit="nowhere")
    class Lost(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("ran")

    outcome = Lost.call()
    assert isinstance(outcome.error, ConfigurationError), outcome
    assert "REACTOR_LIMITS" in str(outcome.error)


def test_a_lost_hash_is_published_again_by_the_sweep() -> None:
    from reactor_app.coordination.redis import get_client
    from reactor_app.engine.sweeper import sweep

    limits.set_override("semaphore", "live", "3", by="ops")
    get_client().delete(live_limits.hash_key())  # a Redis restarted without persistence
    live_limits.forget_copy()
    assert live_limits.semaphore_limit("live") == 1
    sweep()
    live_limits.forget_copy()
    assert live_limits.semaphore_limit("live") == 3


@given(
    st.sampled_from(["second", "minute", "hour", "day", "90", "0.5"]).flatmap(
        lambda first: st.dictionaries(
            st.sampled_from(["second", "minute", "hour", "day", "90", "0.5"]),
            st.integers(1, 10**9),
            min_size=1,
            max_size=4,
        )
    )
)
def test_a_rate_limit_value_reads_back_as_it_was_written(windows: dict[str, int]) -> None:
    text = limits.describe("rate_limit", {"limits": windows})
    value = limits.parse_value("rate_limit", "sms", text)
    assert value == {"limits": windows}


def test_manage_py_check_warns_about_an_unknown_named_semaphore_limit(settings: Any) -> None:
    from reactor_app.checks import check_named_semaphore_limits
    from tests.worker.limit_reactors import PooledReactor  # limit="live_pool"

    def warned() -> set[str]:
        return {w.obj for w in check_named_semaphore_limits() if w.id == "reactor_app.W003"}

    owner = f"{PooledReactor.__module__}.{PooledReactor.__qualname__}.work"
    settings.REACTOR_LIMITS = {}
    assert owner in warned()
    settings.REACTOR_LIMITS = {"live_pool": {"limit": 0}}  # not a limit either
    assert owner in warned()
    settings.REACTOR_LIMITS = {"live_pool": {"limit": 1}}
    assert owner not in warned()
