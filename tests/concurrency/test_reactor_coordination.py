"""Reactor-level coordination: the five decorators on Reactor classes (key from the inputs)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
    compose,
    from_input,
    from_result,
    step,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationKeyError,
    CoordinationUnavailable,
    DefinitionError,
    LockAcquisitionError,
)
from reactor_app.models import CoordinationEvent, StepRun
from reactor_app.testing import assert_not_locked, coordination_state
from tests.concurrency.harness import (
    held_elsewhere,
    max_concurrency,
    now_ns,
    overlaps,
    run_in_processes,
    start_in_line_order,
)
from tests.renewing import KEPT_LEASE, wait_for_rounds

pytestmark = pytest.mark.django_db(transaction=True)

TRACE: list[tuple[str, int, int]] = []


class Body(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        start = now_ns()
        time.sleep(0.003)
        TRACE.append((context.execution_id, start, now_ns()))
        return Success(context.fencing_token())


@with_lock(lambda inputs: f"acct:{inputs['account_id']}", ttl=30, wait=60)
class ExclusiveReactor(Reactor):
    inputs = ("account_id",)
    first = step(Body, account_id=from_input("account_id"))
    second = step(Body, account_id=from_input("account_id"))


def _exclusive_worker(account: int, runs: int) -> list[tuple[str, int, int]]:
    TRACE.clear()
    for _ in range(runs):
        result = ExclusiveReactor.run(account_id=account)
        assert result.ok, result.error
    return list(TRACE)


def _whole_runs(trace: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    spans: dict[str, tuple[int, int]] = {}
    for execution, start, end in trace:
        low, high = spans.get(execution, (start, end))
        spans[execution] = (min(low, start), max(high, end))
    return [(execution, low, high) for execution, (low, high) in spans.items()]


def test_reactor_lock_serializes_whole_runs_across_processes() -> None:
    traces = run_in_processes(_exclusive_worker, [(1, 25)] * 4)
    runs = _whole_runs([entry for chunk in traces for entry in chunk])
    assert len(runs) == 100
    assert overlaps(runs) == []


def test_reactor_lock_on_different_keys_overlaps() -> None:
    traces = run_in_processes(_exclusive_worker, [(n, 10) for n in (1, 2, 3, 4)])
    runs = _whole_runs([entry for chunk in traces for entry in chunk])
    assert max_concurrency(runs) >= 2


def test_fencing_token_reaches_steps_from_the_reactor_lock() -> None:
    tokens = [ExclusiveReactor.run(account_id=9).value["first"] for _ in range(3)]
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


def test_synchronous_contention_returns_a_structured_error() -> None:
    @with_lock(lambda inputs: f"acct:{inputs['account_id']}", wait=0)
    class Quick(Reactor):
        inputs = ("account_id",)
        only = step(Body, account_id=from_input("account_id"))

    with held_elsewhere("acct:8", ttl=30):
        result = Quick.run(account_id=8)
    assert not result.ok
    error = result.error
    assert isinstance(error, LockAcquisitionError)
    assert (error.reactor, error.step, error.key, error.primitive) == (
        Quick.path(),
        None,
        "acct:8",
        "lock",
    )
    assert not StepRun.objects.filter(execution_id=result.execution_id).exists()  # nothing ran


def test_reactor_period_halts_the_second_run_and_failure_does_not_mark() -> None:
    calls: list[str] = []

    class MaybeFail(Step):
        inputs = ("user", "fail")

        def run(self, args: dict[str, Any], context: Any) -> Any:
            calls.append("run")
            if args["fail"]:
                raise RuntimeError("failed")
            return Success("ok")

    @with_period(lambda inputs: f"report:{inputs['user']}", every="day")
    class Daily(Reactor):
        inputs = ("user", "fail")
        work = step(MaybeFail, user=from_input("user"), fail=from_input("fail"))

    assert not Daily.run(user="a", fail=True).ok
    assert Daily.run(user="a", fail=False).ok
    halted = Daily.run(user="a", fail=False)
    assert halted.status == "halted" and halted.halt_reason == "period"
    assert calls == ["run", "run"]


def test_reactor_ordered_lock_orders_by_start() -> None:
    order: list[int] = []

    class Slow(Step):
        inputs = ("n",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            order.append(args["n"])
            time.sleep(0.05)
            return Success(args["n"])

    @with_ordered_lock(lambda inputs: f"ledger:{inputs['ledger']}", poison_pill_timeout=30)
    class Ordered(Reactor):
        inputs = ("ledger", "n")
        apply = step(Slow, n=from_input("n"))

    def start(n: int) -> None:
        from django.db import connection

        try:
            assert Ordered.run(ledger="L", n=n).ok
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(5)]
    start_in_line_order(threads, "ledger:L")  # started in order of n
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3, 4]


def test_reactor_semaphore_limits_concurrent_runs() -> None:
    trace: list[tuple[str, int, int]] = []

    class Hold(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            start = now_ns()
            time.sleep(0.05)
            trace.append((context.execution_id, start, now_ns()))
            return Success(None)

    @with_semaphore(lambda inputs: "pool", limit=3, wait=30)
    class Pooled(Reactor):
        work = step(Hold)

    def go() -> None:
        from django.db import connection

        try:
            assert Pooled.run().ok
        finally:
            connection.close()

    threads = [threading.Thread(target=go) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(trace) == 8
    assert max_concurrency(trace) == 3


def test_composed_child_with_the_same_key_reenters() -> None:
    seen: dict[str, Any] = {}

    class Peek(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            seen["count"] = coordination_state().lock("acct:21").count
            return Success(None)

    @with_lock(lambda inputs: f"acct:{inputs['account_id']}", wait=0)
    class Child(Reactor):
        inputs = ("account_id",)
        peek = step(Peek)

    @with_lock(lambda inputs: f"acct:{inputs['account_id']}", wait=0)
    class Parent(Reactor):
        inputs = ("account_id",)
        child = compose(Child, account_id=from_input("account_id"))

        @step(after=from_result("child"))
        def after(self, args: dict[str, Any], context: Any) -> Any:
            seen["after_child"] = coordination_state().lock("acct:21").count
            return Success(None)

    result = Parent.run(account_id=21)
    assert result.ok, result.error
    assert seen == {"count": 2, "after_child": 1}
    assert_not_locked("acct:21")


def test_key_function_errors_and_bad_options() -> None:
    ran: list[str] = []

    class Never(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            ran.append("x")
            return Success(None)

    @with_lock(lambda inputs: inputs["missing"])
    class BadKey(Reactor):
        inputs = ("x",)
        never = step(Never)

    result = BadKey.run(x=1)
    assert isinstance(result.error, CoordinationKeyError)
    assert result.error.step is None and "KeyError" in result.error.message
    assert ran == []

    with pytest.raises(DefinitionError, match="limit is required"):
        with_semaphore(lambda i: "k")
    with pytest.raises(DefinitionError, match=r"ttl must be a number of seconds from 0\.001"):
        with_lock(lambda i: "k", ttl=0)
    with pytest.raises(DefinitionError, match="every"):
        with_period(lambda i: "k", every="fortnight")
    with pytest.raises(DefinitionError, match="cannot also take"):
        with_rate_limit("stripe", limit=3)
    with pytest.raises(DefinitionError, match="key function"):
        with_lock("acct:1")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="limit= and period="):
        with_rate_limit(lambda i: "k", limit=3)


def test_unknown_named_rate_limit_is_a_clear_error_and_a_check_warning() -> None:
    from django.core.checks import run_checks

    @with_rate_limit("nonexistent-limit")
    class Named(Reactor):
        pass

    result = Named.run()
    assert isinstance(result.error, ConfigurationError)
    assert "nonexistent-limit" in result.error.message
    warnings = [w for w in run_checks() if w.id == "reactor_app.W001"]
    assert any("nonexistent-limit" in w.msg for w in warnings)


def test_redis_unreachable_at_reactor_level(settings: Any) -> None:
    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:1/0"
    result = ExclusiveReactor.run(account_id=1)
    assert isinstance(result.error, CoordinationUnavailable)
    assert not StepRun.objects.filter(execution_id=result.execution_id).exists()


def test_a_lost_reactor_lease_reaches_the_step_at_its_checkpoint() -> None:
    from reactor_app.exceptions import LeaseLost

    class Long(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            Coordinator().force_release("lock", "lease:1")  # an operator takes the key away
            wait_for_rounds(1)  # the next renewal finds the hold gone
            context.checkpoint()
            return Success("should not get here")

    @with_lock(lambda inputs: "lease:1", ttl=KEPT_LEASE)
    class Leased(Reactor):
        work = step(Long)

    result = Leased.run()
    assert isinstance(result.error, LeaseLost)
    assert result.error.key == "lease:1"
    # recorded, with why: gone from Redis while the holder's clock still gave it time
    (lost,) = CoordinationEvent.objects.filter(execution_id=result.execution_id, kind="lease_lost")
    assert lost.key == "lease:1" and lost.detail["reason"].startswith("released with "), lost.detail
    assert "by an operator" in lost.detail["reason"], lost.detail


def test_a_raising_coordination_receiver_never_strands_a_hold() -> None:
    from reactor_app.signals import coordination_event

    def broken(sender: Any, **payload: Any) -> None:
        raise ValueError("receiver bug")

    coordination_event.connect(broken, weak=False)
    try:
        result = ExclusiveReactor.run(account_id=31)
    finally:
        coordination_event.disconnect(broken)
    assert result.ok, result.error
    assert_not_locked("acct:31")


def test_a_receiver_connected_after_events_were_sent_gets_the_next_ones_and_no_more_once_gone() -> (
    None
):
    """The signals cache their receivers per sender; connecting and disconnecting must still
    take effect at once, for the catch-all signal and for an event kind's own signal."""
    from reactor_app import signals

    assert ExclusiveReactor.run(account_id=32).ok  # sends (and caches) with no receiver
    seen: list[tuple[str, str]] = []

    def receiver(sender: Any, kind: str, key: str, **payload: Any) -> None:
        seen.append((str(kind), key))

    signals.acquired.connect(receiver, weak=False)
    signals.coordination_event.connect(receiver, weak=False)
    try:
        assert ExclusiveReactor.run(account_id=33).ok
    finally:
        signals.acquired.disconnect(receiver)
        signals.coordination_event.disconnect(receiver)
    assert seen.count(("acquired", "acct:33")) == 2  # once per signal
    assert ("released", "acct:33") in seen
    seen.clear()
    assert ExclusiveReactor.run(account_id=34).ok
    assert seen == []


def test_renewal_events_name_their_primitive() -> None:
    from reactor_app.models import CoordinationEvent

    class Slow(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            wait_for_rounds(1)
            return Success(None)

    @with_semaphore(lambda inputs: "renewed-pool", limit=2, ttl=KEPT_LEASE)
    class Pool(Reactor):
        work = step(Slow)

    assert Pool.run().ok
    extended = CoordinationEvent.objects.filter(kind="extended", key="renewed-pool")
    assert extended.exists()
    assert set(extended.values_list("primitive", flat=True)) == {"semaphore"}
