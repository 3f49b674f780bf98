"""The checker finds what a broken client breaks, and nothing in ours, on the same workload.

Each broken client (``clients``) runs against the test's real Redis on real threads, every
operation recorded; the checker must report a violation, shrunk to a few operations. The
library's own client of the same primitive runs the same workload (same threads, same
leases, same faults) and must have none — so the workloads are able to show the bug, and the
library does not have it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from demo_project.shop.models import Account
from reactor_app.coordination.admission import Coordinator
from reactor_app.fencing import fenced_update
from reactor_app.testing.history import History, operations
from reactor_app.testing.linearizability import CheckResult, Model, check
from reactor_app.testing.sequential_models import (
    FencedRegisterModel,
    MutexModel,
    PeriodModel,
    RateLimitModel,
    SemaphoreModel,
)
from tests.linearizability.clients import (
    CheckThenSetPeriod,
    CoordinatorLock,
    CoordinatorPeriod,
    CoordinatorRateLimit,
    CoordinatorSemaphore,
    ForgetfulRateLimit,
    OverAdmittingSemaphore,
    RawClient,
    ResettingFenceLock,
    UncheckedReleaseLock,
)
from tests.linearizability.workloads import hold_loop, on_threads

THREADS = 4


def run(
    client: Any,
    model: Model,
    key: str,
    *,
    duration: float = 1.5,
    threads: int = THREADS,
    faults: Callable[[History, threading.Event], None] | None = None,
    **loop: Any,
) -> CheckResult:
    history = History()
    stop = threading.Event()
    nemesis = None
    if faults is not None:
        nemesis = threading.Thread(target=faults, args=(history, stop))
        nemesis.start()
    try:
        on_threads(
            threads,
            lambda n: hold_loop(client, history, key, f"t{n}", duration=duration, seed=n, **loop),
        )
    finally:
        stop.set()
        if nemesis is not None:
            nemesis.join()
    result = check(operations(history.events()), model)
    print(result.summary())
    for violation in result.violations:
        print(violation)
    return result


def assert_violation_found(result: CheckResult, most: int = 12) -> None:
    assert not result.valid and result.violations, result.summary()
    for violation in result.violations:
        # shrunk to a handful of operations a person can read
        assert 2 <= len(violation.operations) <= most, str(violation)


def assert_clean(result: CheckResult, least: int = 20) -> None:
    assert result.valid, "\n".join(str(v) for v in result.violations) or result.summary()
    assert result.checked >= least, result.summary()  # the workload did run


@pytest.fixture
def raw() -> Iterator[Callable[..., Any]]:
    coordinator = Coordinator()

    def make(kind: type[RawClient], **options: Any) -> Any:
        return kind(redis=coordinator.client, prefix=coordinator.prefix, **options)

    yield make


def lose_everything(every: float) -> Callable[[History, threading.Event], None]:
    """A nemesis: every ``every`` seconds, the key space is emptied (as a Redis restarted
    without persistence would find it), recorded as a ``lose`` fault."""

    def nemesis(history: History, stop: threading.Event) -> None:
        coordinator = Coordinator()
        while not stop.wait(every):
            fault = history.nemesis("lose", what="key space emptied")
            names = list(coordinator.client.scan_iter(match=f"{coordinator.prefix}*"))
            if names:
                coordinator.client.delete(*names)
            fault.ok()

    return nemesis


# -- locks ------------------------------------------------------------------------------------

#: holds of up to twice the lease: about half the holders release after losing their lease
SHORT_LEASE = {"hold": (0.0, 0.1)}


def test_a_lock_released_without_its_owner_check_is_caught(raw: Callable[..., Any]) -> None:
    client = raw(UncheckedReleaseLock, ttl=0.05)
    assert_violation_found(run(client, MutexModel(), "lock:unchecked", **SHORT_LEASE))


def test_our_lock_passes_the_same_workload() -> None:
    assert_clean(run(CoordinatorLock(ttl=0.05), MutexModel(), "lock:ours", **SHORT_LEASE))


def test_a_fence_that_resets_with_the_key_space_is_caught(raw: Callable[..., Any]) -> None:
    client = raw(ResettingFenceLock, ttl=5)
    result = run(client, MutexModel(), "lock:resetting", faults=lose_everything(0.3))
    assert_violation_found(result)


def test_our_fencing_tokens_survive_the_same_resets() -> None:
    result = run(CoordinatorLock(ttl=5), MutexModel(), "lock:fence", faults=lose_everything(0.3))
    assert_clean(result)


# -- semaphore, rate limit, period ------------------------------------------------------------

SEMAPHORE = {"hold": (0.002, 0.01)}


def test_a_semaphore_that_checks_then_acts_over_admits_and_is_caught(
    raw: Callable[..., Any],
) -> None:
    client = raw(OverAdmittingSemaphore, limit=2)
    result = run(client, SemaphoreModel(limit=2), "sem:racy", threads=6, **SEMAPHORE)
    assert_violation_found(result)


def test_our_semaphore_passes_the_same_workload() -> None:
    client = CoordinatorSemaphore(limit=2)
    assert_clean(run(client, SemaphoreModel(limit=2), "sem:ours", threads=6, **SEMAPHORE))


RATE = {"pause": (0.0, 0.02)}


def test_a_rate_limit_that_forgets_half_its_window_is_caught(raw: Callable[..., Any]) -> None:
    client = raw(ForgetfulRateLimit, window=0.5, limit=3)
    assert_violation_found(run(client, RateLimitModel(), "rate:forgetful", **RATE))


def test_our_rate_limit_passes_the_same_workload() -> None:
    client = CoordinatorRateLimit(window=0.5, limit=3)
    # 3 per half second: at most 15 admissions in 2.5 s, and the workload keeps asking
    assert_clean(run(client, RateLimitModel(), "rate:ours", duration=2.5, **RATE), least=12)


def test_our_weighted_rate_limit_passes_too() -> None:
    client = CoordinatorRateLimit(window=0.5, limit=5, cost=2)
    # two admissions of cost 2 per half second: at most 10 in 2.5 s
    assert_clean(run(client, RateLimitModel(), "rate:weighted", duration=2.5, **RATE), least=8)


PERIOD = {"hold": (0.02, 0.05), "failures": 0.3}


def test_a_period_that_checks_then_marks_runs_twice_and_is_caught(
    raw: Callable[..., Any],
) -> None:
    client = raw(CheckThenSetPeriod)
    assert_violation_found(run(client, PeriodModel(), "period:racy", duration=0.5, **PERIOD))


def test_our_period_passes_the_same_workload() -> None:
    result = run(CoordinatorPeriod(), PeriodModel(), "period:ours", duration=1.0, **PERIOD)
    assert result.valid, "\n".join(str(v) for v in result.violations)
    # one bucket: a few failed holders and the one that marked it; every other try was a hit
    assert result.checked >= 2, result.summary()


# -- fenced register --------------------------------------------------------------------------


def unchecked_update(queryset: Any, token: int | None, **values: Any) -> int:
    """The broken writer: stores the token, compares nothing."""
    return int(queryset.update(fencing_token=token, **values))


def fenced_writes(
    writer: Callable[..., int], account: int, duration: float
) -> tuple[CheckResult, CheckResult, int]:
    """Holders of our lock (a 50 ms lease; no hold, or one of 90 ms) write the row with their token
    at the end of their hold; the row's history, the locks' and how many writes were refused."""
    from django.db import connection

    history = History()
    lock = CoordinatorLock(ttl=0.05)
    key = f"account:{account}"

    def holder(n: int) -> None:
        rng = random.Random(n)
        deadline = time.monotonic() + duration
        count = 0
        try:
            while time.monotonic() < deadline:
                session = f"t{n}-{count}"
                count += 1
                with history.operation(f"t{n}", "acquire", key, session=session, ttl=0.05) as op:
                    admitted, seen, hold = lock.acquire(key, session)
                    op.ok(admitted=admitted, **seen)
                if not admitted:
                    time.sleep(0.002)
                    continue
                time.sleep(rng.choice((0.0, 0.09)))  # at once, or well past the lease
                token = seen["token"]
                with history.operation(f"t{n}", "write", key, token=token) as op:
                    rows = writer(Account.objects.filter(number=account), token, balance=n)
                    op.ok(accepted=rows == 1)
                with history.operation(f"t{n}", "release", key, session=session) as op:
                    op.ok(**lock.release(key, session, hold))
        finally:
            connection.close()

    on_threads(THREADS, holder)
    ops = operations(history.events())
    writes = check([o for o in ops if o.f == "write"], FencedRegisterModel())
    locks = check([o for o in ops if o.f != "write"], MutexModel())
    print(writes.summary(), locks.summary(), sep="\n")
    for violation in writes.violations:
        print(violation)
    refused = sum(1 for o in ops if o.f == "write" and o.value.get("accepted") is False)
    return writes, locks, refused


@pytest.mark.django_db(transaction=True)
def test_a_write_that_ignores_the_fence_is_caught() -> None:
    Account.objects.create(number=31, balance=0)
    writes, locks, _ = fenced_writes(unchecked_update, 31, duration=1.5)
    assert_violation_found(writes)
    assert locks.valid  # the lock did its part: the writer broke it


@pytest.mark.django_db(transaction=True)
def test_fenced_update_refuses_every_stale_write_of_the_same_workload() -> None:
    Account.objects.create(number=32, balance=0)
    writes, locks, refused = fenced_writes(fenced_update, 32, duration=1.5)
    assert_clean(writes)
    assert locks.valid
    # holders did outlive their leases and were refused: the fence was exercised
    assert refused > 0
