"""A period bucket is reserved while its run is in flight (issue 10, item 1).

Admission reserves the bucket for the holder; success marks it done, anything else frees it,
and a dead holder's reservation lapses with its lease. A racer that finds the bucket in flight
is in contention: in-process it waits (woken by the release) and then skips or runs; on a
worker it parks, is woken by the release, and on its next delivery skips or runs. The owner
re-enters its own reservation. Real Redis, real threads and processes, no mocked clocks.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app import (
    Failure,
    Reactor,
    Skipped,
    Step,
    Success,
    from_input,
    step,
    with_period,
)
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, PeriodClaim, Refused
from reactor_app.coordination.renewal import Renewal
from reactor_app.engine.dispatch import deliver
from reactor_app.exceptions import PeriodInFlightError
from reactor_app.models import ContentionState, Execution
from reactor_app.testing import coordination_state
from tests.concurrency.harness import now_ns
from tests.renewing import KEPT_LEASE, wait_for_rounds

pytestmark = pytest.mark.django_db(transaction=True)

FORK = multiprocessing.get_context("fork")

#: (owner or execution, entered ns, left ns) of every body that ran, in this process
BODIES: list[tuple[str, int, int]] = []
#: set by a holder's body once it is inside; the holder then waits for ``LET_GO``
INSIDE = threading.Event()
LET_GO = threading.Event()


@pytest.fixture(autouse=True)
def clean_slate() -> None:
    BODIES.clear()
    INSIDE.clear()
    LET_GO.clear()


def who(context: Any) -> str:
    return str(context.execution_id or context.owner)


@with_period(lambda args: f"report:{args['user']}", every="day", wait=30)
class Report(Step):
    inputs = ("user", "hold", "fail")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        entered = now_ns()
        if args["hold"]:
            INSIDE.set()
            assert LET_GO.wait(30)
        BODIES.append((who(context), entered, now_ns()))
        if args["fail"]:
            raise RuntimeError("the report could not be sent")
        return Success("sent")


def call_in_thread(**args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        box["outcome"] = Report.call(**args)
        box["returned"] = now_ns()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, box


@pytest.mark.parametrize("holder_fails", [True, False], ids=["holder-fails", "holder-succeeds"])
def test_a_waiting_racer_runs_a_freed_bucket_and_skips_a_done_one(holder_fails: bool) -> None:
    holder, held = call_in_thread(user="u", hold=True, fail=holder_fails)
    assert INSIDE.wait(10)
    reservation = coordination_state().period_reserved("report:u", "day")
    assert reservation is not None and reservation["owner"].startswith("call:")

    racer, raced = call_in_thread(user="u", hold=False, fail=False)
    time.sleep(0.3)
    assert racer.is_alive() and BODIES == []  # waiting: the bucket is neither done nor free
    LET_GO.set()
    holder.join(10)
    racer.join(10)
    assert not racer.is_alive()

    if holder_fails:
        assert isinstance(held["outcome"], Failure)
        assert isinstance(raced["outcome"], Success)
        (first, second) = BODIES
        assert second[1] >= first[2]  # the racer's body entered after the holder's left
        assert coordination_state().period_marked_by("report:u", "day") == second[0]
    else:
        assert isinstance(held["outcome"], Success)
        assert isinstance(raced["outcome"], Skipped) and raced["outcome"].reason == "period"
        assert len(BODIES) == 1
        assert coordination_state().period_marked_by("report:u", "day") == BODIES[0][0]
    assert coordination_state().period_reserved("report:u", "day") is None


def test_without_a_wait_a_bucket_in_flight_is_a_period_in_flight_error() -> None:
    @with_period(lambda args: f"report:{args['user']}", every="day", wait=0)
    class Impatient(Report):
        pass

    holder, _ = call_in_thread(user="v", hold=True, fail=False)
    assert INSIDE.wait(10)
    try:
        outcome = Impatient.call(user="v", hold=False, fail=False)
    finally:
        LET_GO.set()
        holder.join(10)
    assert isinstance(outcome, Failure)
    error = outcome.error
    assert isinstance(error, PeriodInFlightError)
    assert (error.primitive, error.key) == ("period", "report:v")  # type: ignore[attr-defined]
    assert 0 < error.retry_after <= 60  # type: ignore[attr-defined]
    assert error.holder["owner"].startswith("call:")  # type: ignore[attr-defined]
    assert len(BODIES) == 1  # the impatient call never ran its body


# -- a dead holder --------------------------------------------------------------------------


#: a lease a stalled holder still keeps until it is killed (renewed every second)
@with_period(lambda args: f"report:{args['user']}", every="day", ttl=3, wait=10)
class ShortLease(Report):
    pass


def hold_and_hang(ready: Any) -> None:
    class Hang(ShortLease):
        def run(self, args: dict[str, Any], context: Any) -> Any:
            ready.set()
            time.sleep(600)
            return Success("never")

    Hang.call(user="dead", hold=False, fail=False)


def test_a_killed_holders_reservation_lapses_with_its_lease() -> None:
    ready = FORK.Event()
    child = FORK.Process(target=hold_and_hang, args=(ready,))
    child.start()
    try:
        assert ready.wait(20)
        before = coordination_state().period_reserved("report:dead", "day")
        assert before is not None and 0 < before["ttl"] <= 3
    finally:
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(10)
    killed_at = time.monotonic()
    # right after the kill the reservation is still live: nobody may run the bucket yet
    refused = Coordinator().admit([PeriodClaim("report:dead", "day")], Holder(owner="probe"))
    assert isinstance(refused, Refused) and refused.claim.primitive == "period"
    assert refused.blocker is not None and refused.blocker["owner"] == before["owner"]

    outcome = ShortLease.call(user="dead", hold=False, fail=False)
    assert isinstance(outcome, Success), outcome
    assert len(BODIES) == 1 and BODIES[0][1] > 0
    assert time.monotonic() - killed_at <= 10  # it ran within its wait, once the lease lapsed
    assert coordination_state().period_marked_by("report:dead", "day") == BODIES[0][0]


# -- renewal keeps a live holder's reservation ----------------------------------------------


def test_renewal_keeps_a_live_holders_reservation_past_its_ttl() -> None:
    coordinator = Coordinator()
    claim = PeriodClaim("report:slow", "day", ttl=KEPT_LEASE)
    held = coordinator.admit([claim], Holder(owner="slow", execution_id="slow-exec"))
    assert isinstance(held, Admitted)
    renewal = Renewal(held, coordinator=coordinator).start()
    try:
        deadline = time.monotonic() + 15
        # four renewals, a third of a lease apart: past the lease it would have lapsed by
        while renewal.renewals < 4 and time.monotonic() < deadline:
            other = coordinator.admit([claim], Holder(owner="other"))
            assert isinstance(other, Refused), "a live, renewed reservation lapsed"
            time.sleep(0.1)
        assert renewal.lost is None and renewal.renewals >= 4
    finally:
        renewal.stop()
    released = coordinator.release(held, "success")
    assert released.marked == [("period", "report:slow")]
    assert coordination_state().period_marked_by("report:slow", "day") == "slow-exec"


def overtaken(key: str) -> tuple[Coordinator, Admitted, Admitted]:
    """A day's bucket of ``key`` reserved by "first" with a 0.3 s lease that lapses, then by
    "second" (admitted as soon as the first's reservation is gone)."""
    coordinator = Coordinator()
    claim = PeriodClaim(key, "day", ttl=0.3)
    first = coordinator.admit([claim], Holder(owner="first", execution_id="first-exec"))
    assert isinstance(first, Admitted)
    deadline = time.monotonic() + 5.0
    while not isinstance(
        second := coordinator.admit([claim], Holder(owner="second", execution_id="second-exec")),
        Admitted,
    ):
        assert time.monotonic() < deadline, "the lapsed reservation was never freed"
        time.sleep(0.05)
    return coordinator, first, second


def test_a_holder_whose_reservation_is_gone_does_not_mark_a_bucket_another_marked() -> None:
    """Found by the restart fault schedule (tests/chaos/test_fault_histories.py): a holder's
    reservation vanished (here its lease lapsed; there a Redis restarted empty), another holder
    was admitted and marked the bucket, then the first one's body ended in success. Its
    release used to mark the bucket again and report it marked — two successes of one bucket
    in the history. It now reports the hold as not held and leaves the mark to the other."""
    coordinator, first, second = overtaken("report:lost")
    assert coordinator.release(second, "success").marked == [("period", "report:lost")]
    late = coordinator.release(first, "success")
    assert late.marked == [] and late.not_held == [("period", "report:lost")]
    assert coordination_state().period_marked_by("report:lost", "day") == "second-exec"


def test_regression_a_holder_whose_reservation_lapsed_does_not_mark_a_bucket_another_holds() -> (
    None
):
    """Found by the Sentinel failover schedule under ``make soak`` (a loaded machine): one
    holder's admission reply came 0.73 s after it was sent, past its 0.5 s lease; another was
    admitted to the bucket meanwhile; then both bodies succeeded and both releases marked the
    bucket — two successes of one bucket. The first release found its reservation gone and the
    bucket not marked *yet*, and marked it. A reservation gone while another holder's is live
    now leaves the mark to that holder (as when the other has marked already): the late one is
    reported not held."""
    coordinator, first, second = overtaken("report:overtaken")
    late = coordinator.release(first, "success")  # the second still holds its reservation
    assert late.marked == [] and late.not_held == [("period", "report:overtaken")]
    assert coordination_state().period_marked_by("report:overtaken", "day") is None
    assert coordinator.release(second, "success").marked == [("period", "report:overtaken")]
    assert coordination_state().period_marked_by("report:overtaken", "day") == "second-exec"


def test_a_holder_whose_reservation_lapsed_unchallenged_still_marks_its_bucket() -> None:
    """The other side of the rule above: a lapsed reservation nobody took meanwhile marks
    the bucket on success, so the work is not run again for it."""
    coordinator = Coordinator()
    claim = PeriodClaim("report:unchallenged", "day", ttl=0.1)
    first = coordinator.admit([claim], Holder(owner="first", execution_id="first-exec"))
    assert isinstance(first, Admitted)
    time.sleep(0.3)  # lapsed (a stall only lets it lapse further)
    released = coordinator.release(first, "success")
    assert released.marked == [("period", "report:unchallenged")]
    assert coordination_state().period_marked_by("report:unchallenged", "day") == "first-exec"


# -- re-entrancy ----------------------------------------------------------------------------


def test_the_owner_reenters_its_reservation_and_the_outermost_release_decides() -> None:
    coordinator = Coordinator()
    claim = PeriodClaim("nested", "day")
    outer = coordinator.admit([claim], Holder(owner="root", execution_id="e1"))
    inner = coordinator.admit([claim], Holder(owner="root", execution_id="e1", step="child"))
    assert isinstance(outer, Admitted) and isinstance(inner, Admitted)
    assert (outer.holds[0].fresh, inner.holds[0].fresh) == (True, False)
    assert coordination_state().period_reserved("nested", "day")["count"] == 2  # type: ignore[index]

    assert coordinator.release(inner, "success").marked == []  # the outer run is not over
    assert isinstance(coordinator.admit([claim], Holder(owner="other")), Refused)
    assert coordinator.release(outer, "success").marked == [("period", "nested")]
    assert coordination_state().period_reserved("nested", "day") is None


def test_the_same_unit_coming_back_takes_its_reservation_over() -> None:
    """A redelivery of a unit whose earlier delivery died finds its own reservation: it takes
    it over instead of nesting, so its release decides the bucket (nothing leaks)."""
    coordinator = Coordinator()
    claim = PeriodClaim("redelivered", "day")
    unit = Holder(owner="root", execution_id="e2", step="digest")
    assert isinstance(coordinator.admit([claim], unit), Admitted)  # the dead delivery
    again = coordinator.admit([claim], unit)
    assert isinstance(again, Admitted) and again.holds[0].fresh
    assert coordinator.release(again, "success").marked == [("period", "redelivered")]
    assert coordination_state().period_reserved("redelivered", "day") is None


@with_period(lambda inputs: f"board:{inputs['user']}", every="day")
class Board(Reactor):
    inputs = ("user",)

    @step(user=from_input("user"))
    @with_period(lambda args: f"board:{args['user']}", every="day")
    def publish(self, args: dict[str, Any], context: Any) -> Any:
        BODIES.append((who(context), now_ns(), now_ns()))
        return Success("published")


def test_a_step_reenters_its_reactors_reservation_of_the_same_bucket() -> None:
    result = Board.run(user="b")
    assert result.ok, result.error
    assert len(BODIES) == 1  # the step ran inside its own reactor's reservation
    assert coordination_state().period_marked_by("board:b", "day") == str(result.execution_id)
    assert coordination_state().period_reserved("board:b", "day") is None
    assert Board.run(user="b").status == "halted"


# -- on a worker: park, woken by the release, then skip or run ------------------------------


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    """Deliveries run in this process (``deliver`` is the task body); what they enqueue goes
    to a queue nobody reads."""
    settings.REACTOR_CELERY_QUEUE = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CONTENTION_BACKOFF = [0.01, 0.02]
    yield


class Publish(Step):
    inputs = ("user",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        BODIES.append((who(context), now_ns(), now_ns()))
        return Success("published")


@with_period(lambda args: f"feed:{args['user']}", every="day")
class DailyPublish(Publish):
    pass


class Feed(Reactor):
    inputs = ("user",)
    publish = step(DailyPublish, user=from_input("user"))


@pytest.mark.parametrize("outcome", ["failure", "success"])
def test_a_parked_execution_is_woken_by_the_release_then_runs_or_skips(
    in_process: None, outcome: str
) -> None:
    coordinator = Coordinator()
    other = Holder(owner="other-root", execution_id="other-exec", step="publish")
    blocker = coordinator.admit([PeriodClaim("feed:w", "day")], other)
    assert isinstance(blocker, Admitted)
    execution = Feed.run_async(user="w")
    assert deliver(str(execution.id))["outcome"] == "parked"
    parked = ContentionState.objects.get(execution=execution)
    assert (parked.primitive, parked.key) == ("period", "feed:w")
    assert parked.blocker["owner"] == "other-root"
    assert BODIES == []

    released = coordinator.release(blocker, outcome)  # type: ignore[arg-type]
    assert str(execution.id) in released.woken  # the release hands the waiter its wake-up
    assert deliver(str(execution.id))["outcome"] == "succeeded"
    execution.refresh_from_db()
    assert execution.status == "succeeded"
    publish = Execution.objects.get(pk=execution.pk).step_runs.filter(step="publish").last()
    if outcome == "failure":
        assert len(BODIES) == 1 and publish is not None and publish.status == "succeeded"
        marked_by = coordination_state().period_marked_by("feed:w", "day")
        assert marked_by == str(execution.id)
    else:
        assert BODIES == [] and publish is not None and publish.status == "skipped"
        assert coordination_state().period_marked_by("feed:w", "day") == "other-exec"


def test_a_lock_and_a_period_on_one_key_are_both_renewed_and_only_the_lock_reported() -> None:
    """The renewal callback names only a key; a period reservation sharing the lock's key is
    renewed silently, so every ``extended`` event stays the lock's."""
    from reactor_app.coordination.claims import LockClaim

    coordinator = Coordinator()
    claims = [LockClaim("both", ttl=KEPT_LEASE), PeriodClaim("both", "day", ttl=KEPT_LEASE)]
    held = coordinator.admit(claims, Holder(owner="both-owner", execution_id="both-exec"))
    assert isinstance(held, Admitted)
    reported: list[tuple[str, int]] = []
    renewal = Renewal(
        held, coordinator=coordinator, on_extended=lambda k, ms: reported.append((k, ms))
    )
    renewal.start()
    try:
        assert wait_for_rounds(4) >= 4  # past the lease: both would have lapsed without them
        assert renewal.lost is None
        assert coordination_state().lock("both").held
        assert coordination_state().period_reserved("both", "day") is not None
    finally:
        renewal.stop()
    assert renewal.renewals >= 3
    assert len(reported) == renewal.renewals  # one per round: the lock's, not the period's
    coordinator.release(held, "success")
