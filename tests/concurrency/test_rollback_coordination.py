"""Rollback re-takes what the forward path took — the lock and the semaphore — and only those.

DESIGN §2.5: ``compensate`` and ``undo`` re-take the step's lock and semaphore (same key, same
owner), wherever they were declared — on the step class, on the inline step, or placed on the
step in the reactor (``with_lock(key)(step(Cls, ...))``); never its ordered lock, rate limit or
period. Each hook proves it holds the key from inside its own body (``assert_locked`` /
``coordination_state``), an outside owner is refused, and a contending execution in another
thread enters only after the hook has finished.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from reactor_app import (
    Reactor,
    Step,
    Success,
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
from reactor_app.coordination.claims import Holder, LockClaim, Refused, SemaphoreClaim
from reactor_app.models import CoordinationEvent
from reactor_app.status import CoordinationEventKind
from reactor_app.testing import (
    assert_locked,
    assert_not_locked,
    assert_semaphore_count,
    coordination_state,
)
from tests.concurrency.harness import now_ns
from tests.concurrency.test_step_coordination import FORMS, coordinated_step

pytestmark = pytest.mark.django_db(transaction=True)


def account_key(args: dict[str, Any]) -> str:
    return f"acct:{args['account_id']}"


def _run_closing(reactor: type[Reactor], inputs: dict[str, Any], box: dict[str, Any]) -> None:
    from django.db import connection

    try:
        box["result"] = reactor.run(**inputs)
    finally:
        connection.close()


class _Contender:
    """Another execution locking ``acct:<id>`` (wait 10 s), run in a thread from inside a
    rollback hook: it must enter only after the hook has returned."""

    def __init__(self, account_id: int) -> None:
        self.entered: list[int] = []
        entered = self.entered

        class Contender(Reactor):
            inputs = ("account_id",)

            @step(account_id=from_input("account_id"))
            @with_lock(account_key, ttl=30, wait=10)
            def charge(self, args: dict[str, Any], context: Any) -> Any:
                entered.append(now_ns())
                return Success("contender")

        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(
            target=_run_closing, args=(Contender, {"account_id": account_id}, self.box)
        )

    def start(self) -> None:
        self.thread.start()

    def check_entered_after(self, exit_ns: int) -> None:
        self.thread.join(15)
        assert self.box["result"].ok, self.box["result"].error
        assert len(self.entered) == 1
        assert self.entered[0] >= exit_ns, "the contender entered while the hook held the key"


def _hold_check(key: str, context: Any, seen: dict[str, Any], contender: _Contender) -> None:
    """Inside a rollback hook: the key is held by this step of this execution; an outside
    owner is refused; a contender starts waiting and the hook keeps the key a while."""
    seen["locked"] = assert_locked(key, by_step="charge", by_execution=context.execution_id)
    seen["intruder"] = Coordinator().admit([LockClaim(key=key, ttl=5)], Holder(owner="intruder"))
    contender.start()
    time.sleep(0.3)  # the hook's work; the contender waits on the key meanwhile
    seen["exit_ns"] = now_ns()


def _rollback_acquisitions(execution_id: str, key: str) -> int:
    return CoordinationEvent.objects.filter(
        execution_id=execution_id, key=key, kind=CoordinationEventKind.ACQUIRED
    ).count()


# -- a declaration placed on the step in the reactor ----------------------------------------


def test_compensate_of_a_placed_lock_runs_holding_the_key() -> None:
    seen: dict[str, Any] = {}
    contender = _Contender(21)

    class Charge(Step):  # declares nothing itself: the lock is placed in the reactor
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("card declined")

        def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
            seen["error"] = str(error)
            _hold_check("acct:21", context, seen, contender)

    class R(Reactor):
        inputs = ("account_id",)
        charge = with_lock(account_key, ttl=30, wait=0)(
            step(Charge, account_id=from_input("account_id"))
        )

    assert not Charge.declares_coordination()
    result = R.run(account_id=21)
    assert not result.ok and result.rollback_failures == []
    assert seen["error"] == "card declined"
    assert seen["locked"].owner == result.execution_id
    assert isinstance(seen["intruder"], Refused)
    contender.check_entered_after(seen["exit_ns"])
    assert_not_locked("acct:21")


def test_undo_of_a_placed_lock_runs_holding_the_key() -> None:
    """Fails on a main whose rollback reads only the class's declarations."""
    seen: dict[str, Any] = {}
    contender = _Contender(22)

    class Charge(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("charged")

        def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
            seen["result"] = result
            _hold_check("acct:22", context, seen, contender)

    class R(Reactor):
        inputs = ("account_id",)
        charge = with_lock(account_key, ttl=30, wait=0)(
            step(Charge, account_id=from_input("account_id"))
        )

        @step(after=from_result("charge"))
        def boom(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("later step failed")

    result = R.run(account_id=22)
    assert not result.ok and result.rollback_failures == []
    assert seen["result"] == "charged"
    assert seen["locked"].owner == result.execution_id
    assert isinstance(seen["intruder"], Refused)
    contender.check_entered_after(seen["exit_ns"])
    # one fresh acquisition forward, one for the undo (the forward hold was long released)
    assert _rollback_acquisitions(result.execution_id, "acct:22") == 2
    assert_not_locked("acct:22")


# -- the semaphore is re-taken -------------------------------------------------------------


@pytest.mark.parametrize("site", ["class", "placed"])
def test_undo_re_takes_the_semaphore_slot(site: str) -> None:
    seen: dict[str, Any] = {}

    def pool(args: dict[str, Any]) -> str:
        return f"pool:{args['account_id']}"

    class Charge(Step):
        inputs = ("account_id",)

        def run(self, args: dict[str, Any], context: Any) -> Any:
            return Success("charged")

        def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
            seen["state"] = assert_semaphore_count("pool:23", 1, limit=1)
            seen["intruder"] = Coordinator().admit(
                [SemaphoreClaim(key="pool:23", limit=1, ttl=5)], Holder(owner="intruder")
            )

    declaration = with_semaphore(pool, limit=1, ttl=30)
    if site == "class":
        Charge = declaration(Charge)  # type: ignore[misc]
        charge_spec = step(Charge, account_id=from_input("account_id"))
    else:
        charge_spec = declaration(step(Charge, account_id=from_input("account_id")))

    class R(Reactor):
        inputs = ("account_id",)
        charge = charge_spec

        @step(after=from_result("charge"))
        def boom(self, args: dict[str, Any], context: Any) -> Any:
            # the forward slot was given back when the step ended
            seen["between"] = coordination_state().semaphore("pool:23").held
            raise RuntimeError("later step failed")

    result = R.run(account_id=23)
    assert not result.ok and result.rollback_failures == []
    assert seen["between"] == 0
    (holder,) = seen["state"].holders
    assert (holder.owner, holder.execution, holder.step) == (
        result.execution_id,
        result.execution_id,
        "charge",
    )
    assert isinstance(seen["intruder"], Refused)  # the single slot was the undo's
    assert coordination_state().semaphore("pool:23").held == 0


# -- ordered lock, rate limit and period are not re-taken ----------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_undo_re_takes_lock_and_semaphore_but_not_ordered_lock_rate_limit_or_period(
    form: str,
) -> None:
    seen: dict[str, Any] = {}
    passed: list[str] = []

    class LineContender(Reactor):
        """Another execution passing the same ordered line."""

        inputs = ("stream",)

        @step(stream=from_input("stream"))
        @with_ordered_lock(lambda a: f"line:{a['stream']}", poison_pill_timeout=30, wait=5)
        def apply(self, args: dict[str, Any], context: Any) -> Any:
            passed.append(context.execution_id)
            return Success("passed")

    def undo(result: Any, args: dict[str, Any], context: Any) -> None:
        state = coordination_state()
        seen["lock"] = state.lock("acct:s24")
        seen["semaphore"] = state.semaphore("pool:s24").held
        seen["rate"] = state.rate_limit("api:s24", "minute")
        seen["ordered"] = state.ordered_lock("line:s24")
        # The undo holds no position on the line: a later arrival passes while it runs.
        box: dict[str, Any] = {}
        contender = threading.Thread(
            target=_run_closing, args=(LineContender, {"stream": "s24"}, box)
        )
        contender.start()
        contender.join(15)
        seen["contender"] = box.get("result")

    class R(Reactor):
        inputs = ("stream",)
        charge = coordinated_step(
            form,
            [
                with_ordered_lock(lambda a: f"line:{a['stream']}", poison_pill_timeout=30),
                with_period(lambda a: f"once:{a['stream']}", every="day"),
                with_lock(lambda a: f"acct:{a['stream']}", ttl=30),
                with_semaphore(lambda a: f"pool:{a['stream']}", limit=1, ttl=30),
                with_rate_limit(lambda a: f"api:{a['stream']}", limit=1, period="minute"),
            ],
            lambda args, context: Success("charged"),
            inputs=("stream",),
            undo=undo,
            stream=from_input("stream"),
        )

        @step(after=from_result("charge"))
        def boom(self, args: dict[str, Any], context: Any) -> Any:
            raise RuntimeError("later step failed")

    result = R.run(stream="s24")
    assert not result.ok and result.rollback_failures == []
    # the lock and the semaphore were re-taken for the undo...
    assert seen["lock"].held and seen["lock"].owner == result.execution_id
    assert seen["lock"].step == "charge"
    assert seen["semaphore"] == 1
    # ...the rate limit was not charged again (its budget of 1 was spent forward)...
    assert seen["rate"] == 1
    # ...and the ordered line was not re-entered: nothing in flight, the next arrival passed
    assert seen["ordered"].in_flight is None
    assert seen["contender"] is not None and seen["contender"].ok, seen["contender"]
    assert passed == [seen["contender"].execution_id]
    acquired = Counter(
        CoordinationEvent.objects.filter(
            execution_id=result.execution_id, kind=CoordinationEventKind.ACQUIRED
        ).values_list("primitive", flat=True)
    )
    # forward: one admission of each primitive; rollback: the lock and the semaphore again
    assert acquired == {
        "ordered_lock": 1,
        "period": 1,
        "rate_limit": 1,
        "lock": 2,
        "semaphore": 2,
    }, acquired
    assert_not_locked("acct:s24")
