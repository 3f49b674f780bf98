"""The shop's reactors keep their promises — asserted with ``reactor_app.testing`` only.

Coordination state is read and asserted through ``coordination_state()`` and the ``assert_*``
helpers; Redis and the Celery worker come from the plugin's fixtures (``reactor_key_space``,
``reactor_redis``, ``celery_worker_process``). Overlaps are read from the ``Activity`` rows
the step bodies write. In-process tests shorten the bodies' pauses (the geometry stays: charge
outlasts audit, notify outlasts charge); the worker processes run them at full length.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.db import connections

from demo_project.shop import reactors
from demo_project.shop.models import Account, Activity
from reactor_app.exceptions import RateLimitExceeded
from reactor_app.models import CoordinationEvent, Execution, StepRun
from reactor_app.testing import (
    assert_held_by_step,
    assert_locked,
    assert_not_locked,
    assert_period_marked,
    assert_period_not_marked,
    assert_rate_limit_count,
    assert_token_greater,
    coordination_state,
)

T = TypeVar("T")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shorter step bodies for in-process runs."""
    for name, seconds in {
        "AUDIT_SECONDS": 0.1,
        "CHARGE_SECONDS": 0.4,
        "NOTIFY_SECONDS": 0.6,
        "REFUND_SECONDS": 0.5,
    }.items():
        monkeypatch.setattr(reactors, name, seconds)


@pytest.fixture
def account() -> Account:
    return Account.objects.create(number=7, balance=100)


def wait_for(predicate: Callable[[], T], timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s")
        time.sleep(0.01)
    return found


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``target`` in a thread; its return value lands in the returned list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def intervals(step: str, kind: str = "run") -> list[tuple[float, float]]:
    rows = Activity.objects.filter(step=step, kind=kind)
    return [(r.started_at.timestamp(), r.finished_at.timestamp()) for r in rows]


def acquired_tokens(key: str) -> list[int]:
    """The fencing tokens of the fresh acquisitions of lock ``key``, in the order taken."""
    events = CoordinationEvent.objects.filter(primitive="lock", key=key, kind="acquired")
    return [e.token for e in events.order_by("at", "pk") if e.token is not None]


def overlaps(spans: list[tuple[float, float]]) -> int:
    ordered = sorted(spans)
    return sum(
        1
        for index, (_, end) in enumerate(ordered)
        for start, _ in ordered[index + 1 :]
        if start < end
    )


# -- in-process ------------------------------------------------------------------------------


@pytest.mark.usefixtures("quick")
def test_charge_holds_the_account_key_for_its_step_only(account: Account) -> None:
    thread, out = in_thread(lambda: reactors.PaymentReactor.run(account_id=7, amount=30))
    state = coordination_state()
    wait_for(lambda: state.lock("acct:7").held)
    assert_held_by_step("acct:7", "charge", primitive="lock")
    assert_locked("acct:7", by_step="charge")
    thread.join(10)

    (result,) = out
    assert result.ok, result.error
    assert_not_locked("acct:7")  # released at the end of charge, whatever followed
    (token,) = acquired_tokens("acct:7")
    assert coordination_state().lock("acct:7").last_token == token
    account.refresh_from_db()
    assert (account.balance, account.fencing_token) == (70, token)


@pytest.mark.usefixtures("quick", "account")
def test_two_payments_serialize_charge_and_overlap_elsewhere() -> None:
    runs = [in_thread(lambda: reactors.PaymentReactor.run(account_id=7, amount=10)) for _ in "ab"]
    for thread, _ in runs:
        thread.join(20)

    assert all(out[0].ok for _, out in runs)
    assert overlaps(intervals("charge")) == 0
    assert overlaps(intervals("audit")) == 1
    assert overlaps(intervals("notify")) == 1
    assert_not_locked("acct:7")
    first, second = acquired_tokens("acct:7")  # two fresh acquisitions, increasing tokens
    assert assert_token_greater("acct:7", first) == second


@pytest.mark.usefixtures("quick")
def test_refund_runs_holding_the_account_key(account: Account) -> None:
    thread, out = in_thread(lambda: reactors.FaxedPaymentReactor.run(account_id=7, amount=30))
    wait_for(lambda: StepRun.objects.filter(step="charge", kind="undo").exists())
    execution = Execution.objects.get()
    assert_held_by_step("acct:7", "charge", execution=execution.pk)
    thread.join(10)

    (result,) = out
    assert result.status == "failed" and result.error.step == "notify"
    assert result.rollback_failures == []
    assert_not_locked("acct:7")
    charge, refund = acquired_tokens("acct:7")  # the refund re-took the key: a fresh token
    assert assert_token_greater("acct:7", charge) == refund
    account.refresh_from_db()
    assert (account.balance, account.fencing_token) == (100, refund)


@pytest.mark.usefixtures("account")
def test_the_offer_runs_once_a_day_and_the_statement_still_goes_out() -> None:
    assert_period_not_marked("offer:7", "day")
    first = reactors.StatementReactor.run(account_id=7)
    assert_period_marked("offer:7", "day", by=first.execution_id)

    second = reactors.StatementReactor.run(account_id=7)

    assert second.ok and second.value == {"sent": True, "offer": None}
    skipped = StepRun.objects.get(execution_id=second.execution_id, step="offer")
    assert (skipped.status, skipped.detail.get("reason")) == ("skipped", "period")


@pytest.mark.usefixtures("account")
def test_texts_over_the_limit_are_refused_in_process() -> None:
    assert [reactors.LowBalanceAlertReactor.run(account_id=7).ok for _ in "ab"] == [True, True]
    assert_rate_limit_count("sms:7", reactors.SMS_WINDOW, 2)

    third = reactors.LowBalanceAlertReactor.run(account_id=7)

    assert isinstance(third.error, RateLimitExceeded)
    assert (third.error.step, third.error.key) == ("text", "sms:7")
    assert_rate_limit_count("sms:7", reactors.SMS_WINDOW, 2)  # a refusal charges nothing


# -- on a real Celery worker -----------------------------------------------------------------


@pytest.fixture(scope="module")
def celery_worker_settings() -> dict[str, Any]:
    # a wake-up by the release is then clearly faster than the backoff requeue; the brief
    # in-delivery wait is shorter than the charge, so the second payment does park
    return {"REACTOR_CONTENTION_BACKOFF": [3.0, 10.0], "REACTOR_WORKER_WAIT": 0.2}


@pytest.fixture
def worker(celery_worker_process: Any) -> Iterator[Any]:
    yield celery_worker_process
    assert celery_worker_process.alive(), celery_worker_process.log()


@pytest.mark.worker
def test_a_contended_payment_parks_and_completes(worker: Any, account: Account) -> None:
    first = reactors.PaymentReactor.run_async(account_id=7, amount=10)
    wait_for(lambda: coordination_state().lock("acct:7").held)
    assert_held_by_step("acct:7", "charge", execution=first.pk)
    second = reactors.PaymentReactor.run_async(account_id=7, amount=20)

    assert first.wait(timeout=60).ok
    assert second.wait(timeout=60).ok

    parked = StepRun.objects.filter(execution=second, step="charge", status="parked")
    assert parked.exists()
    assert not StepRun.objects.exclude(kind="run").exists()  # no compensation, no undo
    assert overlaps(intervals("charge")) == 0
    assert_not_locked("acct:7")
    assert_token_greater("acct:7", 1)
    account.refresh_from_db()
    assert account.balance == 70


@pytest.mark.worker
@pytest.mark.usefixtures("account")
def test_an_alert_over_the_limit_parks_until_the_window_frees(worker: Any) -> None:
    alerts = [reactors.LowBalanceAlertReactor.run_async(account_id=7) for _ in "abc"]
    wait_for(lambda: StepRun.objects.filter(step="text", status="parked").exists())
    assert_rate_limit_count("sms:7", reactors.SMS_WINDOW, 2)

    assert all(alert.wait(timeout=60).ok for alert in alerts)
    starts = sorted(start for start, _ in intervals("text"))
    assert starts[2] - starts[0] >= reactors.SMS_WINDOW - 0.25
