"""Step-scoped coordination (the core feature), with real Redis and real parallelism.

Every scenario runs twice, with class steps and with inline ``@step`` methods (``FORMS``,
``coordinated_step``); only ``Step.call`` re-entrancy is class-only by nature.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

import pytest

from reactor_app import (
    Failure,
    Reactor,
    Step,
    Success,
    from_input,
    from_result,
    step,
    value,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim, Refused
from reactor_app.exceptions import (
    CoordinationKeyError,
    CoordinationUnavailable,
    LockAcquisitionError,
    RateLimitExceeded,
)
from reactor_app.models import CoordinationEvent, StepRun
from reactor_app.testing import (
    assert_locked,
    assert_not_locked,
    assert_ordered_lock,
    assert_period_marked,
    coordination_state,
    within_freshness_bound,
)
from reactor_app.write_behind import flush
from tests.concurrency.harness import (
    held_elsewhere,
    max_concurrency,
    now_ns,
    overlaps,
    run_in_processes,
    start_in_line_order,
)

pytestmark = pytest.mark.django_db(transaction=True)

FORMS = ["class", "inline"]
TRACE: list[tuple[str, str, int, int]] = []  # (step, execution, start_ns, end_ns)


def account_key(args: dict[str, Any]) -> str:
    return f"acct:{args['account_id']}"


def traced(name: str, args: dict[str, Any], context: Any, seconds: float) -> None:
    start = now_ns()
    time.sleep(seconds)
    TRACE.append((name, context.execution_id, start, now_ns()))


def build_payment(
    form: str,
    *,
    lock_options: dict[str, Any] | None = None,
    body: float = 0.004,
    edge: float = 0.01,
    fail_notify: bool = False,
) -> type[Reactor]:
    """PaymentReactor: audit -> charge (step-level lock on the account) -> notify."""
    options = {"ttl": 30, "wait": 60, **(lock_options or {})}

    class AuditStep(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            traced("audit", args, context, edge)
            return Success("audited")

    class NotifyStep(Step):
        inputs = ("charge", "channel")

        def run(self, args: dict[str, Any], context: Any) -> Any:
            traced("notify", args, context, edge)
            if fail_notify:
                raise RuntimeError("notify failed")
            return Success("sent")

    if form == "class":

        @with_lock(account_key, **options)
        class ChargeStep(Step):
            inputs = ("account_id", "amount")

            def run(self, args: dict[str, Any], context: Any) -> Any:
                traced("charge", args, context, body)
                return Success({"charged": args["amount"], "token": context.fencing_token()})

            def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
                traced("charge.undo", args, context, body)

        class PaymentReactor(Reactor):
            inputs = ("account_id", "amount")
            audit = step(AuditStep, account_id=from_input("account_id"))
            charge = step(
                ChargeStep, account_id=from_input("account_id"), amount=from_input("amount")
            )
            notify = step(NotifyStep, charge=from_result("charge"), channel=value("email"))

        PaymentReactor.step_form = ChargeStep  # type: ignore[attr-defined]
        return PaymentReactor

    class InlinePaymentReactor(Reactor):
        inputs = ("account_id", "amount")
        audit = step(AuditStep, account_id=from_input("account_id"))

        @step(account_id=from_input("account_id"), amount=from_input("amount"))
        @with_lock(account_key, **options)
        def charge(self, args: dict[str, Any], context: Any) -> Any:
            traced("charge", args, context, body)
            return Success({"charged": args["amount"], "token": context.fencing_token()})

        @charge.undo
        def undo_charge(self, result: Any, args: dict[str, Any], context: Any) -> None:
            traced("charge.undo", args, context, body)

        notify = step(NotifyStep, charge=from_result("charge"), channel=value("email"))

    return InlinePaymentReactor


def coordinated_step(
    form: str,
    decorators: list[Any],
    run: Any,
    *,
    inputs: tuple[str, ...] = (),
    undo: Any = None,
    compensate: Any = None,
    **arguments: Any,
) -> Any:
    """A step for a reactor body, declared as a ``Step`` subclass or as an inline ``@step``
    method, with the same coordination ``decorators``, body and rollback hooks."""
    if form == "class":
        attrs: dict[str, Any] = {
            "inputs": inputs,
            "run": lambda self, args, context: run(args, context),
        }
        if undo is not None:
            attrs["undo"] = lambda self, result, args, context: undo(result, args, context)
        if compensate is not None:
            attrs["compensate"] = lambda self, error, args, context: compensate(
                error, args, context
            )
        step_class: Any = type("CoordinatedStep", (Step,), attrs)
        for decorator in reversed(decorators):
            step_class = decorator(step_class)
        return step(step_class, **arguments)

    def body(self: Any, args: dict[str, Any], context: Any) -> Any:
        return run(args, context)

    for decorator in reversed(decorators):
        body = decorator(body)
    spec = step(inputs=inputs, **arguments)(body)
    if undo is not None:
        spec.undo(lambda self, result, args, context: undo(result, args, context))
    if compensate is not None:
        spec.compensate(lambda self, error, args, context: compensate(error, args, context))
    return spec


def _payment_worker(form: str, account: int, runs: int) -> list[tuple[str, str, int, int]]:
    TRACE.clear()
    reactor = build_payment(form)
    for index in range(runs):
        result = reactor.run(account_id=account, amount=index)
        assert result.ok, result.error
    return list(TRACE)


def _by_step(trace: list[tuple[str, str, int, int]], name: str) -> list[tuple[str, int, int]]:
    return [
        (execution, start, end) for step_name, execution, start, end in trace if step_name == name
    ]


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
def test_sc001_sc002_same_account_charge_never_overlaps(form: str) -> None:
    traces = run_in_processes(_payment_worker, [(form, 1, 50)] * 4)
    trace = [entry for chunk in traces for entry in chunk]
    charges = _by_step(trace, "charge")
    assert len(charges) == 200
    assert overlaps(charges) == []  # SC-001
    # SC-002: the unlocked steps of the same executions did run concurrently.
    assert max_concurrency(_by_step(trace, "audit")) >= 2
    assert max_concurrency(_by_step(trace, "notify")) >= 2
    assert_not_locked("acct:1")


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
def test_sc002_different_accounts_overlap_everywhere(form: str) -> None:
    traces = run_in_processes(_payment_worker, [(form, account, 15) for account in (1, 2, 3, 4)])
    trace = [entry for chunk in traces for entry in chunk]
    for name in ("audit", "charge", "notify"):
        assert max_concurrency(_by_step(trace, name)) >= 2, name


def _hold_in_thread(
    reactor: type[Reactor], gate: threading.Event, release: threading.Event, **inputs: Any
) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        from django.db import connection

        try:
            box["result"] = reactor.run(**inputs)
        finally:
            box["returned_ns"] = now_ns()
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("ending", ["success", "failure", "exception"])
def test_sc003_key_is_free_at_once_after_every_outcome(form: str, ending: str) -> None:
    entered = threading.Event()
    proceed = threading.Event()
    stamps: dict[str, int] = {}

    def body(self: Any, args: dict[str, Any], context: Any) -> Any:
        if args["role"] == "holder":
            entered.set()
            proceed.wait(10)
            stamps["holder_exit"] = now_ns()
            if ending == "failure":
                return Failure("declined", retryable=False)
            if ending == "exception":
                raise RuntimeError("boom")
            return Success("ok")
        stamps["waiter_enter"] = now_ns()
        return Success("ok")

    decorator = with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=10)
    if form == "class":
        step_class = decorator(
            type("Charge", (Step,), {"run": body, "inputs": ("account_id", "role")})
        )

        class R(Reactor):
            inputs = ("account_id", "role")
            charge = step(step_class, account_id=from_input("account_id"), role=from_input("role"))
    else:

        class R(Reactor):  # type: ignore[no-redef]
            inputs = ("account_id", "role")
            charge = step(account_id=from_input("account_id"), role=from_input("role"))(
                decorator(body)
            )

    holder, holder_box = _hold_in_thread(R, entered, proceed, account_id=7, role="holder")
    assert entered.wait(10)
    waiter, waiter_box = _hold_in_thread(R, entered, proceed, account_id=7, role="waiter")
    time.sleep(0.2)
    assert "waiter_enter" not in stamps  # it is waiting on the held key
    proceed.set()
    holder.join(10)
    waiter.join(10)
    assert holder_box["result"].ok is (ending == "success")
    assert waiter_box["result"].ok, waiter_box["result"].error
    gap_ms = (stamps["waiter_enter"] - stamps["holder_exit"]) / 1e6
    # The waiter is woken by the release, not by polling: not woken, its next attempt would
    # come when its 10 s wait ends (the lock's retry hint is its 30 s lease). Woken, it enters a
    # few ms after the body on a quiet machine; a 2-core machine running two test suites has
    # been seen to take a fifth of a second on one server and a quarter on the cluster (the
    # wake-up crosses the cluster bus) — still ten times below the first poll. The bound
    # separates the two, not fast from slow: speed is the benchmarks' (bench/wake_latency.py).
    assert 0 <= gap_ms < 1000, gap_ms
    assert_not_locked("acct:7")


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
def test_sc006_reactor_and_step_on_the_same_key_do_not_self_wait(form: str) -> None:
    seen: dict[str, Any] = {}

    def inner(args: dict[str, Any], context: Any) -> Any:
        seen["count_inside"] = coordination_state().lock("acct:5").count
        seen["other"] = Coordinator().admit(
            [LockClaim(key="acct:5", ttl=5)], Holder(owner="someone-else")
        )
        return Success("ok")

    @with_lock(lambda inputs: f"acct:{inputs['account_id']}", ttl=30, wait=0)
    class Outer(Reactor):
        inputs = ("account_id",)
        work = coordinated_step(
            form,
            [with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)],
            inner,
            inputs=("account_id",),
            account_id=from_input("account_id"),
        )

        @step(after=from_result("work"))
        def after_step(self, args: dict[str, Any], context: Any) -> Any:
            seen["count_after_step"] = coordination_state().lock("acct:5").count
            return Success("done")

    result = Outer.run(account_id=5)
    assert result.ok, result.error  # with wait=0 a self-wait would have failed
    assert seen["count_inside"] == 2
    assert isinstance(seen["other"], Refused)
    assert seen["count_after_step"] == 1  # the step's nested hold is gone, the reactor's stays
    assert_not_locked("acct:5")


def test_step_call_from_a_step_body_reenters_the_execution_hold() -> None:
    @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)
    class Ledger(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(coordination_state().lock("acct:9").count)

    @with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)
    class Charge(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            nested = Ledger.call(account_id=args["account_id"], context=context)
            return Success(nested.value)

    class R(Reactor):
        inputs = ("account_id",)
        charge = step(Charge, account_id=from_input("account_id"))

    result = R.run(account_id=9)
    assert result.ok, result.error
    assert result.value["charge"] == 2
    # Without the execution's context, a direct call is its own owner and meets contention.
    with held_elsewhere("acct:9", ttl=5):
        outcome = Ledger.call(account_id=9)
        assert isinstance(outcome, Failure)
        assert isinstance(outcome.error, LockAcquisitionError)


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
def test_sc009_undo_runs_holding_the_account_key(form: str) -> None:
    reactor = build_payment(form, fail_notify=True)
    seen: dict[str, Any] = {}
    original_traced = globals()["traced"]

    def spy(name: str, args: dict[str, Any], context: Any, seconds: float) -> None:
        if name == "charge.undo":
            seen["state"] = coordination_state().lock("acct:3")
            seen["locked"] = assert_locked(
                "acct:3", by_step="charge", by_execution=context.execution_id
            )
            seen["intruder"] = Coordinator().admit(
                [LockClaim(key="acct:3", ttl=5)], Holder(owner="intruder")
            )
        original_traced(name, args, context, seconds)

    globals()["traced"] = spy
    try:
        result = reactor.run(account_id=3, amount=1)
    finally:
        globals()["traced"] = original_traced
    assert not result.ok
    state = seen["state"]
    assert state.held and state.owner == result.execution_id and state.step == "charge"
    assert seen["locked"].count == 1
    assert isinstance(seen["intruder"], Refused)  # nobody can enter charge during its undo
    assert_not_locked("acct:3")


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
def test_sc009_undo_that_cannot_acquire_is_reported(form: str) -> None:
    intruder: dict[str, Any] = {}

    def never_undo(result: Any, args: dict[str, Any], context: Any) -> None:
        raise AssertionError("must not run without the lock")

    class R(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0, rollback_wait=0.3)],
            lambda args, context: Success("charged"),
            inputs=("account_id",),
            undo=never_undo,
            account_id=from_input("account_id"),
        )

        @step(after=from_result("charge"))
        def seize(self, args: dict[str, Any], context: Any) -> Any:
            intruder["hold"] = Coordinator().admit(
                [LockClaim(key="acct:4", ttl=30)], Holder(owner="intruder")
            )
            raise RuntimeError("later step failed")

    try:
        started = time.monotonic()
        result = R.run(account_id=4)
        elapsed = time.monotonic() - started
    finally:
        Coordinator().release(intruder["hold"], "success")
    assert not result.ok
    assert len(result.rollback_failures) == 1
    failure = dict(result.rollback_failures[0])
    error = failure.pop("error")
    assert failure == {
        "step": "charge",
        "kind": "undo",
        "reason": "coordination_unavailable",
        "key": "acct:4",
        "primitive": "lock",
    }
    # the undo met the intruder's hold (not some other error) and waited its rollback_wait
    assert error["type"] == "LockAcquisitionError", error
    assert (error["key"], error["primitive"], error["step"]) == ("acct:4", "lock", "charge")
    assert elapsed >= 0.3


@pytest.mark.parametrize("form", FORMS)
def test_sc009_compensate_runs_holding_the_account_key(form: str) -> None:
    """The failing step's compensate runs inside its lock: an intruder is refused and a
    contending execution enters only after the compensation has finished."""
    seen: dict[str, Any] = {}
    contender_entered: list[int] = []

    class Contender(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=10)],
            lambda args, context: contender_entered.append(now_ns()) or Success("ok"),
            inputs=("account_id",),
            account_id=from_input("account_id"),
        )

    def failing_charge(args: dict[str, Any], context: Any) -> Any:
        raise RuntimeError("card declined")

    def compensate(error: BaseException, args: dict[str, Any], context: Any) -> None:
        seen["error"] = error
        seen["locked"] = assert_locked(
            "acct:13", by_step="charge", by_execution=context.execution_id
        )
        seen["intruder"] = Coordinator().admit(
            [LockClaim(key="acct:13", ttl=5)], Holder(owner="intruder")
        )
        contender = threading.Thread(target=_run_closing, args=(Contender, {"account_id": 13}))
        contender.start()
        seen["contender"] = contender
        time.sleep(0.3)  # the compensation's work; the contender waits on the key meanwhile
        seen["compensate_exit"] = now_ns()

    class R(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [with_lock(lambda a: f"acct:{a['account_id']}", ttl=30, wait=0)],
            failing_charge,
            inputs=("account_id",),
            compensate=compensate,
            account_id=from_input("account_id"),
        )

    result = R.run(account_id=13)
    seen["contender"].join(15)
    assert not result.ok and result.rollback_failures == []
    assert str(seen["error"]) == "card declined"  # compensate ran, with the step's own error
    assert seen["locked"].owner == result.execution_id
    assert isinstance(seen["intruder"], Refused)
    assert len(contender_entered) == 1
    assert contender_entered[0] >= seen["compensate_exit"]
    assert_not_locked("acct:13")


@pytest.mark.parametrize("form", FORMS)
def test_sc009_compensation_that_cannot_acquire_is_reported(form: str) -> None:
    """The step's lease lapsed inside its body (no auto-extend) and an intruder took the key:
    compensate cannot re-take it within ``rollback_wait``, so it does not run and the failure
    is reported with the key."""
    intruder: dict[str, Any] = {}

    def body(args: dict[str, Any], context: Any) -> Any:
        deadline = time.monotonic() + 10
        while coordination_state().lock("acct:14").held:  # the 0.5 s lease runs out
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.02)
        intruder["hold"] = Coordinator().admit(
            [LockClaim(key="acct:14", ttl=30)], Holder(owner="intruder")
        )
        raise RuntimeError("failed after losing the lease")

    def never_compensate(error: BaseException, args: dict[str, Any], context: Any) -> None:
        raise AssertionError("must not run without the lock")

    class R(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [
                with_lock(
                    lambda a: f"acct:{a['account_id']}",
                    ttl=0.5,
                    wait=0,
                    auto_extend=False,
                    rollback_wait=0.3,
                )
            ],
            body,
            inputs=("account_id",),
            compensate=never_compensate,
            account_id=from_input("account_id"),
        )

    try:
        result = R.run(account_id=14)
        assert isinstance(intruder["hold"], Admitted), intruder["hold"]
        # the step's exit did not free the intruder's hold
        assert_locked("acct:14", by_owner="intruder")
    finally:
        Coordinator().release(intruder["hold"], "success")
    assert not result.ok
    assert len(result.rollback_failures) == 1
    failure = dict(result.rollback_failures[0])
    error = failure.pop("error")
    assert failure == {
        "step": "charge",
        "kind": "compensate",
        "reason": "coordination_unavailable",
        "key": "acct:14",
        "primitive": "lock",
    }
    assert error["type"] == "LockAcquisitionError", error
    assert_not_locked("acct:14")


@pytest.mark.usefixtures("redis_topology")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("bad", ["none", "empty", "raises"])
def test_sc011_uncomputable_key_never_runs_the_work(form: str, bad: str) -> None:
    ran: list[str] = []

    def key(args: dict[str, Any]) -> Any:
        if bad == "raises":
            raise KeyError("account_id")
        return None if bad == "none" else ""

    def body(self: Any, args: dict[str, Any], context: Any) -> Any:
        ran.append("body")
        return Success("ok")

    if form == "class":
        step_class = with_lock(key)(type("K", (Step,), {"run": body}))

        class R(Reactor):
            charge = step(step_class)
    else:

        class R(Reactor):  # type: ignore[no-redef]
            charge = step()(with_lock(key)(body))

    result = R.run()
    assert ran == []
    assert isinstance(result.error, CoordinationKeyError)
    assert result.error.step == "charge"
    assert "charge" in result.error.message
    assert (
        ("KeyError" in result.error.message)
        if bad == "raises"
        else ("returned" in result.error.message)
    )


@pytest.mark.parametrize("form", FORMS)
def test_synchronous_contention_fails_names_step_and_undoes_prior_steps(form: str) -> None:
    undone: list[str] = []

    class First(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("first")

        def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
            undone.append("first")

    def must_not_run(args: dict[str, Any], context: Any) -> Any:
        raise AssertionError("must not run")

    class R(Reactor):
        inputs = ("account_id",)
        first = step(First)
        charge = coordinated_step(
            form,
            [with_lock(lambda a: f"acct:{a['account_id']}", wait=0.2)],
            must_not_run,
            inputs=("account_id",),
            compensate=lambda error, args, context: undone.append("charge-compensated"),
            account_id=from_input("account_id"),
        )

    with held_elsewhere("acct:2", ttl=30):
        started = time.monotonic()
        result = R.run(account_id=2)
        waited = time.monotonic() - started
    assert isinstance(result.error, LockAcquisitionError)
    assert (result.error.reactor, result.error.step, result.error.key, result.error.primitive) == (
        R.path(),
        "charge",
        "acct:2",
        "lock",
    )
    assert "charge" in result.error.message and "acct:2" in result.error.message
    assert undone == ["first"]  # the contended step is not compensated
    assert waited >= 0.2
    failed = CoordinationEvent.objects.filter(kind="acquisition_failed", key="acct:2").get()
    assert failed.step == "charge"


@pytest.mark.parametrize("form", FORMS)
def test_events_carry_primitive_key_and_owning_step(form: str) -> None:
    reactor = build_payment(form)
    result = reactor.run(account_id=11, amount=1)
    assert result.ok
    events = list(CoordinationEvent.objects.filter(key="acct:11").order_by("at", "id"))
    assert [e.kind for e in events] == ["acquired", "released"]
    for event in events:
        assert (event.primitive, event.step, event.owner) == ("lock", "charge", result.execution_id)
        assert str(event.execution_id) == result.execution_id
    assert events[0].token == result.value["charge"]["token"]


@pytest.mark.parametrize("form", FORMS)
def test_fencing_tokens_strictly_increase_per_fresh_acquisition(form: str) -> None:
    reactor = build_payment(form)
    tokens = [reactor.run(account_id=12, amount=i).value["charge"]["token"] for i in range(5)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


# -- the other primitives at step level -----------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_semaphore_at_step_level_reaches_but_never_exceeds_limit(form: str) -> None:
    def work_body(args: dict[str, Any], context: Any) -> Any:
        traced("work", args, context, 0.05)
        return Success("ok")

    class R(Reactor):
        inputs = ("pool",)
        work = coordinated_step(
            form,
            [with_semaphore(lambda a: f"pool:{a['pool']}", limit=2, wait=30)],
            work_body,
            inputs=("pool",),
            pool=from_input("pool"),
        )

    TRACE.clear()
    threads = [threading.Thread(target=_run_closing, args=(R, {"pool": "a"})) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    intervals = _by_step(TRACE, "work")
    assert len(intervals) == 6
    assert max_concurrency(intervals) == 2


def _run_closing(reactor: type[Reactor], inputs: dict[str, Any]) -> None:
    from django.db import connection

    try:
        result = reactor.run(**inputs)
        assert result.ok, result.error
    finally:
        connection.close()


@pytest.mark.parametrize("form", FORMS)
def test_rate_limit_at_step_level_and_not_applied_to_rollback(form: str) -> None:
    undone: list[int] = []

    class R(Reactor):
        inputs = ("tenant", "n", "fail")
        call = coordinated_step(
            form,
            [with_rate_limit(lambda a: f"api:{a['tenant']}", limit=3, period="minute")],
            lambda args, context: Success(args["n"]),
            inputs=("tenant", "n"),
            undo=lambda result, args, context: undone.append(result),
            tenant=from_input("tenant"),
            n=from_input("n"),
        )

        @step(fail=from_input("fail"), after=from_result("call"))
        def maybe_fail(self, args: dict[str, Any], context: Any) -> Any:
            return Failure("later failure", retryable=False) if args["fail"] else Success("ok")

    results = [R.run(tenant="t", n=i, fail=(i == 2)) for i in range(4)]
    assert [r.ok for r in results] == [True, True, False, False]
    assert undone == [2]  # the third run's undo ran although the budget was spent
    refused = results[3].error
    assert isinstance(refused, RateLimitExceeded)
    assert refused.step == "call" and refused.key == "api:t"
    assert 0 < refused.retry_after <= 60


@pytest.mark.parametrize("form", FORMS)
def test_period_at_step_level_skips_the_step_and_the_workflow_continues(form: str) -> None:
    ran: list[str] = []

    def digest_body(args: dict[str, Any], context: Any) -> Any:
        ran.append("digest")
        return Failure("smtp down", retryable=False) if args["fail"] else Success("sent")

    class R(Reactor):
        inputs = ("user", "fail")
        digest = coordinated_step(
            form,
            [with_period(lambda a: f"digest:{a['user']}", every="hour")],
            digest_body,
            inputs=("user", "fail"),
            user=from_input("user"),
            fail=from_input("fail"),
        )

        @step(after=from_result("digest"))
        def after(self, args: dict[str, Any], context: Any) -> Any:
            ran.append("after")
            return Success(args["after"])

    failed = R.run(user="u1", fail=True)
    assert not failed.ok  # a failed run does not mark the bucket...
    first = R.run(user="u1", fail=False)  # ...so this one runs
    second = R.run(user="u1", fail=False)
    assert first.ok and second.ok
    assert ran == ["digest", "digest", "after", "after"]
    assert second.value["after"] is None  # the skipped step's value flowed on
    skipped = StepRun.objects.get(execution_id=second.execution_id, step="digest")
    assert (skipped.status, skipped.detail["reason"]) == ("skipped", "period")


@pytest.mark.parametrize("form", FORMS)
def test_period_is_not_applied_to_rollback(form: str) -> None:
    undone: list[str] = []

    class R(Reactor):
        inputs = ("user",)
        digest = coordinated_step(
            form,
            [with_period(lambda a: f"welcome:{a['user']}", every="day")],
            lambda args, context: Success("sent"),
            inputs=("user",),
            undo=lambda result, args, context: undone.append(result),
            user=from_input("user"),
        )

        @step(after=from_result("digest"))
        def boom(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("later step failed")

    result = R.run(user="u2")
    assert not result.ok
    assert_period_marked("welcome:u2", "day")  # the step succeeded and marked its bucket...
    assert undone == ["sent"]  # ...and its undo still ran: a marked bucket never blocks cleanup


@pytest.mark.parametrize("form", FORMS)
def test_ordered_lock_at_step_level_passes_in_arrival_order_and_strict_stops_the_line(
    form: str,
) -> None:
    entered: list[int] = []

    def apply_body(args: dict[str, Any], context: Any) -> Any:
        entered.append(args["n"])
        time.sleep(0.3)  # longer than the arrival spacing: later arrivals queue on the line
        return Failure("bad event", retryable=False) if args["n"] == 3 else Success(args["n"])

    class R(Reactor):
        inputs = ("stream", "n")
        apply = coordinated_step(
            form,
            [with_ordered_lock(lambda a: f"seq:{a['stream']}", poison_pill_timeout=30)],
            apply_body,
            inputs=("stream", "n"),
            stream=from_input("stream"),
            n=from_input("n"),
        )

    results: dict[int, Any] = {}

    def arrive(n: int) -> None:
        from django.db import connection

        try:
            results[n] = R.run(stream="s", n=n)
        finally:
            connection.close()

    threads = [threading.Thread(target=arrive, args=(n,)) for n in range(6)]
    start_in_line_order(threads, "seq:s")  # arrival order = n
    for thread in threads:
        thread.join(60)
    assert entered == [0, 1, 2, 3]  # in position order; after 3 failed, the line stopped
    assert [results[n].ok for n in range(4)] == [True, True, True, False]
    for n in (4, 5):
        assert results[n].ok
        run = StepRun.objects.get(execution_id=results[n].execution_id, step="apply")
        assert run.detail["reason"] == "ordered_lock_chain_failed"
    assert_ordered_lock("seq:s", first_failed=4)


@pytest.mark.parametrize("form", FORMS)
def test_redis_unreachable_fails_the_step_and_the_work_never_runs(form: str, settings: Any) -> None:
    ran: list[str] = []

    class R(Reactor):
        charge = coordinated_step(
            form,
            [with_lock(lambda a: "acct:down")],
            lambda args, context: ran.append("body") or Success("ok"),
        )

    settings.REACTOR_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    result = R.run()
    assert ran == []
    assert isinstance(result.error, CoordinationUnavailable)
    assert result.error.step == "charge"
    assert "the protected work did not run" in result.error.message, result.error.message


def test_a_release_that_cannot_reach_redis_is_recorded_as_failed_not_released(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The body ran, then the store went away: the step's result stands, and its history says
    the hold was never given back (it lapses with its lease) — a ``release_failed`` event with
    the cause, never ``released``. Neither the log nor the event says the work did not run:
    it did (the outage error, in the log's traceback, used to say so whatever the call it
    broke)."""
    from reactor_app.testing.servers import StandaloneServer

    with StandaloneServer() as server:
        settings.REACTOR_REDIS_URL = server.url

        @with_lock(lambda args: "acct:gone", ttl=30)
        class GoesAway(Step):
            def run(self, args: dict[str, Any], context: Any) -> Any:
                server.stop()  # after the admission, before the release
                return Success("done")

        result = GoesAway.call()
    assert result.ok and result.value == "done"
    flush()  # the rows are written behind the call
    kinds = list(
        CoordinationEvent.objects.filter(key="acct:gone")
        .order_by("at")
        .values_list("kind", flat=True)
    )
    assert kinds == ["acquired", "release_failed"], kinds
    failed = CoordinationEvent.objects.get(key="acct:gone", kind="release_failed")
    assert failed.detail["outcome"] == "success" and failed.detail["cause"]
    assert "did not run" not in failed.detail["cause"], failed.detail["cause"]
    (logged,) = [r for r in caplog.records if r.getMessage().startswith("could not release")]
    assert logged.exc_info is not None
    told = "".join(traceback.format_exception(*logged.exc_info))
    assert "unreachable" in told and "did not run" not in told, told


def test_a_renewal_that_cannot_reach_redis_does_not_say_the_work_did_not_run(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The store goes away while the body runs: the renewal logs that it failed and will try
    again, naming the outage — and not claiming the work did not run, as the outage error used
    to whatever the call it broke (the body is running: it is what the renewal protects)."""
    from reactor_app.testing.servers import StandaloneServer

    def renewal_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("renewal of")]

    with StandaloneServer() as server:
        settings.REACTOR_REDIS_URL = server.url

        @with_lock(lambda args: "acct:lapsing", ttl=3)  # renewed every second
        class RenewedDuringAnOutage(Step):
            def run(self, args: dict[str, Any], context: Any) -> Any:
                server.stop()
                deadline = time.monotonic() + 10
                while not renewal_warnings() and time.monotonic() < deadline:
                    time.sleep(0.05)
                return Success("done")

        RenewedDuringAnOutage.call()
    told = renewal_warnings()
    assert told, "no renewal failed while the store was gone"
    assert all("unreachable" in m and "did not run" not in m for m in told), told


def test_a_step_declaring_nothing_takes_no_hold() -> None:
    class Plain(Step):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(context.fencing_token())

    class R(Reactor):
        plain = step(Plain)

    assert not Plain.declares_coordination()
    result = R.run()
    assert result.value == {"plain": None}
    assert not CoordinationEvent.objects.exists()


def test_introspection_inheritance_and_replacement() -> None:
    @with_lock(lambda a: "k1", ttl=10)
    @with_semaphore(lambda a: "s", limit=2)
    class Base(Step):
        pass

    @with_lock(lambda a: "k2", ttl=20)
    class Child(Base):
        pass

    assert Base.declares_coordination()
    assert [d.primitive for d in Child.coordination_declarations()] == ["lock", "semaphore"]
    assert Child.lock_config.ttl == 20 and Base.lock_config.ttl == 10
    assert Child.semaphore_config.limit == 2

    class R(Reactor):
        @step()
        @with_period(lambda a: "p", every="day")
        def inline(self, args: dict[str, Any], context: Any) -> Any:
            return Success(None)

    assert R.steps["inline"].period_config.every == "day"
    assert R.steps["inline"].declares_coordination()


@pytest.mark.parametrize("form", FORMS)
def test_a_body_that_skips_does_not_mark_the_period_and_does_not_stop_the_line(form: str) -> None:
    from reactor_app import Skipped
    from reactor_app.testing import assert_period_not_marked

    calls: list[int] = []

    def apply_body(args: dict[str, Any], context: Any) -> Any:
        calls.append(args["n"])
        return Skipped(reason="not ready") if args["n"] == 0 else Success(args["n"])

    class R(Reactor):
        inputs = ("stream", "n")
        apply = coordinated_step(
            form,
            [
                with_ordered_lock(lambda a: f"seq:{a['stream']}", poison_pill_timeout=30, wait=5),
                with_period(lambda a: f"once:{a['stream']}", every="day"),
            ],
            apply_body,
            inputs=("stream", "n"),
            stream=from_input("stream"),
            n=from_input("n"),
        )

    assert R.run(stream="s", n=0).ok
    assert_period_not_marked("once:s", "day")  # only a success marks the bucket
    assert R.run(stream="s", n=1).value["apply"] == 1  # so the next run does the work
    assert calls == [0, 1]
    assert_ordered_lock("seq:s", first_failed=None)
    assert_period_marked("once:s", "day")


@pytest.mark.parametrize("form", FORMS)
def test_each_primitive_waits_only_as_long_as_its_own_wait(form: str) -> None:
    ran: list[str] = []

    class R(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [
                with_ordered_lock(lambda a: f"line:{a['account_id']}", poison_pill_timeout=30),
                with_lock(lambda a: f"acct:{a['account_id']}", wait=0),
            ],
            lambda args, context: ran.append("body") or Success("ok"),
            inputs=("account_id",),
            account_id=from_input("account_id"),
        )

    with held_elsewhere("acct:41", ttl=30):
        started = time.monotonic()
        result = R.run(account_id=41)
        waited = time.monotonic() - started
    # The ordered lock would wait its turn for up to 30 s; the lock's wait=0 fails at once.
    assert isinstance(result.error, LockAcquisitionError)
    assert waited < 2, waited
    assert ran == []


def test_step_call_records_its_coordination_events() -> None:
    @with_lock(lambda a: f"acct:{a['account_id']}")
    class Direct(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success(context.owner)

    outcome = Direct.call(account_id=51)

    def both_events() -> list[CoordinationEvent]:
        found = list(CoordinationEvent.objects.filter(key="acct:51").order_by("at", "id"))
        return found if len(found) >= 2 else []

    # written behind the call: present within the freshness bound
    events = within_freshness_bound(both_events)
    assert [e.kind for e in events] == ["acquired", "released"]
    assert {e.owner for e in events} == {outcome.value}  # the per-call owner
    assert all(e.execution_id is None and e.step.endswith("Direct") for e in events)


@pytest.mark.parametrize("form", FORMS)
def test_a_run_that_fails_at_the_gate_leaves_the_ordered_line(form: str) -> None:
    from reactor_app.models import Execution

    seen: dict[str, Any] = {}

    def body(args: dict[str, Any], context: Any) -> Any:
        # The position is persisted before the body runs: a crash now could find it again.
        row = Execution.objects.get(pk=context.execution_id)
        seen["persisted"] = row.context["ordered"]["charge"]["nonce"]
        return Success("ok")

    class R(Reactor):
        inputs = ("account_id",)
        charge = coordinated_step(
            form,
            [
                with_ordered_lock(lambda a: f"line:{a['account_id']}", poison_pill_timeout=30),
                with_lock(lambda a: f"acct:{a['account_id']}", wait=0),
            ],
            body,
            inputs=("account_id",),
            account_id=from_input("account_id"),
        )

    with held_elsewhere("acct:61", ttl=30):
        first = R.run(account_id=61)  # takes position 1, then fails on the held lock
    assert isinstance(first.error, LockAcquisitionError)
    started = time.monotonic()
    second = R.run(account_id=61)  # position 2: must not wait for the abandoned position 1
    assert second.ok, second.error
    assert time.monotonic() - started < 5
    assert seen["persisted"] == 2
    assert_ordered_lock("line:61", last_completed=2, first_failed=None)
