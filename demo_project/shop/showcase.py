"""The step-lock showcase behind ``manage.py demo_step_lock`` (spec quickstart, Scenario 6).

It runs the shop's reactors along five paths, each on fresh accounts (so fresh keys):

1. **serialized** — N payments of one account at once, in this process (threads): ``charge``
   bodies never overlap, ``audit`` and ``notify`` bodies do;
2. **contended** — N payments of one account on Celery workers: while one holds the account
   key in ``charge`` the others are *parked* (not failed), woken when the key is released, and
   all complete with no compensation;
3. **compensated** — a payment whose receipt fails is rolled back: its ``charge`` is undone
   while holding the account key again, and a concurrent payment of the account waits for the
   refund;
4. **period** — two statements of one account the same day: the second skips the ``offer``
   step and is still sent;
5. **rate limit** — three alerts over a limit of two texts per window, on workers: the third
   parks until the window frees.

Every claim is judged from what was recorded — ``Activity`` rows written by the step bodies
(intervals), ``StepRun`` and ``CoordinationEvent`` rows (holds, parks, resumes), and live reads
of Redis through ``reactor_app.testing`` while the paths run — never from timing assumptions.
``Showcase.run()`` returns a ``PathReport`` per path; ``report.py`` renders them.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Max
from django.utils import timezone

from demo_project.shop import reactors
from demo_project.shop.models import Account, Activity
from reactor_app.models import ContentionState, CoordinationEvent, Execution, StepRun
from reactor_app.status import (
    CoordinationEventKind,
    ExecutionStatus,
    StepRunKind,
    StepRunStatus,
)
from reactor_app.testing import LockState, coordination_state
from reactor_app.testing.assertions import describe_lock

T = TypeVar("T")

#: balance every demo account opens with
OPENING_BALANCE = 1000
#: seconds a worker execution may take before the showcase gives up on it
EXECUTION_TIMEOUT = 90.0
#: how far (s) a body may start before the rate-limit window of the first one ends: admission
#: happens a few milliseconds before the body starts, and the body's start is what we record
ADMISSION_SLACK = 0.25


class ShowcaseError(Exception):
    """A path could not be run to the point where its claims can be judged."""


@dataclass
class Verdict:
    claim: str
    passed: bool
    evidence: str

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "passed": self.passed, "evidence": self.evidence}


@dataclass
class PathReport:
    """One path: what ran, where, on which keys, and the verdict on each of its claims."""

    name: str
    title: str
    runs_on: str
    keys: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # execution id -> "P1", "P2", ...
    started: datetime = field(default_factory=timezone.now)
    finished: datetime | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.verdicts) and all(v.passed for v in self.verdicts)

    def label(self, execution_id: Any) -> str:
        return self.labels.get(str(execution_id), str(execution_id)[:8] if execution_id else "-")

    def judge(self, claim: str, passed: bool, evidence: str) -> Verdict:
        verdict = Verdict(claim, bool(passed), self.humanize(evidence))
        self.verdicts.append(verdict)
        return verdict

    def observe(self, text: str) -> str:
        self.observations.append(self.humanize(text))
        return self.observations[-1]

    def humanize(self, text: str) -> str:
        """``text`` with every execution id of this path shown as its label (``P1`` ...)."""
        for execution, label in self.labels.items():
            text = text.replace(execution, label)
        return text


@dataclass(frozen=True)
class Interval:
    """One step body, from its ``Activity`` row."""

    execution: str
    step: str
    kind: str
    start: datetime
    end: datetime
    pid: int
    token: int | None

    @classmethod
    def of(cls, row: Activity) -> Interval:
        return cls(
            str(row.execution_id),
            row.step,
            row.kind,
            row.started_at,
            row.finished_at,
            row.pid,
            row.fencing_token,
        )


def overlapping(intervals: Sequence[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals that overlap in time (touching ends do not count)."""
    ordered = sorted(intervals, key=lambda i: i.start)
    pairs = []
    for index, current in enumerate(ordered):
        for other in ordered[index + 1 :]:
            if other.start >= current.end:
                break
            pairs.append((current, other))
    return pairs


def poll(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02) -> T:
    """Call ``predicate`` until it returns something truthy; ``ShowcaseError`` after
    ``timeout`` seconds, saying what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise ShowcaseError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _span(interval: Interval, zero: datetime) -> str:
    """``"1.21-2.42s"``: the interval in seconds since ``zero``."""
    return f"{_seconds(interval.start, zero):.2f}-{_seconds(interval.end, zero):.2f}s"


class Showcase:
    """Runs the paths; see the module docstring.

    ``executions`` is N of the serialized and contended paths; ``say`` receives progress
    lines. The contended, compensated and rate-limit paths need Celery workers consuming
    ``REACTOR_CELERY_QUEUE`` (``demo_step_lock`` starts them).
    """

    PATHS = ("serialized", "contended", "compensated", "period", "rate_limit")

    def __init__(
        self,
        executions: int = 3,
        *,
        say: Callable[[str], None] = print,
        execution_timeout: float = EXECUTION_TIMEOUT,
    ) -> None:
        if executions < 2:
            raise ValueError("the showcase needs at least 2 executions per path")
        self.executions = executions
        self.say = say
        self.execution_timeout = execution_timeout
        self.state = coordination_state()

    def run(self, paths: Iterable[str] | None = None) -> list[PathReport]:
        reports = []
        for name in paths or self.PATHS:
            method = getattr(self, f"path_{name}")
            reports.append(method())
        return reports

    # -- shared ---------------------------------------------------------------------------

    def open_account(self) -> Account:
        """A fresh account: a number never used in this database, whose keys were never used
        in Redis either (resetting the database does not reset Redis, and a period mark or a
        fencing counter left there would change what the paths show)."""
        number = max(Account.objects.aggregate(top=Max("number"))["top"] or 0, 1000) + 1
        while not self._fresh(number):
            number += 1
        return Account.objects.create(number=number, balance=OPENING_BALANCE)

    def _fresh(self, number: int) -> bool:
        return (
            self.state.lock(reactors.account_key({"account_id": number})).last_token is None
            and not self.state.period_marked(f"offer:{number}", "day")
            and self.state.rate_limit(f"sms:{number}", reactors.SMS_WINDOW) == 0
        )

    def _begin(self, name: str, title: str, runs_on: str) -> PathReport:
        self.say(f"\n== {title} ({runs_on})")
        return PathReport(name=name, title=title, runs_on=runs_on)

    def _guarded(self, report: PathReport, body: Callable[[PathReport], None]) -> PathReport:
        try:
            body(report)
        except Exception as exc:  # report a path that could not run; never hide it
            report.error = f"{type(exc).__name__}: {exc}"
            report.judge("the path ran to the end", False, report.error)
            self.say(f"   ! {report.error}")
        report.finished = timezone.now()
        for verdict in report.verdicts:
            self.say(f"   {'PASS' if verdict.passed else 'FAIL'}  {verdict.claim}")
        return report

    def _label(self, report: PathReport, execution_id: Any) -> str:
        label = f"P{len(report.labels) + 1}"
        report.labels[str(execution_id)] = label
        return label

    def _wait_all(self, report: PathReport, executions: Sequence[Execution]) -> list[Any]:
        results = []
        for execution in executions:
            result = execution.wait(timeout=self.execution_timeout)
            self.say(
                f"   {report.label(execution.id)} {result.status}"
                + (f": {result.error}" if result.error and not result.ok else "")
            )
            results.append(result)
        return results

    @staticmethod
    def _bodies(executions: Iterable[Any], step: str, kind: str = "run") -> list[Interval]:
        rows = Activity.objects.filter(
            execution_id__in=[str(e) for e in executions], step=step, kind=kind
        )
        return [Interval.of(row) for row in rows]

    def _describe_intervals(
        self, report: PathReport, intervals: Sequence[Interval], zero: datetime
    ) -> str:
        return ", ".join(
            f"{report.label(i.execution)} {_span(i, zero)}"
            for i in sorted(intervals, key=lambda i: i.start)
        )

    def _serialization_verdicts(
        self, report: PathReport, ids: Sequence[str], account: Account, amounts: Sequence[int]
    ) -> None:
        zero = report.started
        charges = self._bodies(ids, "charge")
        clashes = overlapping(charges)
        report.judge(
            "charge bodies never overlapped",
            len(charges) == len(ids) and not clashes,
            f"{len(charges)} charges, {len(clashes)} overlapping pairs: "
            + self._describe_intervals(report, charges, zero),
        )
        in_order = sorted(charges, key=lambda i: i.start)
        tokens = [i.token for i in in_order]
        account.refresh_from_db()
        expected = OPENING_BALANCE - sum(amounts)
        increasing = all(
            a is not None and b is not None and a < b for a, b in itertools.pairwise(tokens)
        )
        report.judge(
            "each charge wrote under a newer fencing token, and every fenced write landed",
            increasing and account.balance == expected and account.fencing_token == tokens[-1],
            f"tokens in charge order {tokens}; balance {account.balance} "
            f"(expected {OPENING_BALANCE} - {sum(amounts)} = {expected}); "
            f"stored token {account.fencing_token}",
        )

    # -- 1. serialized ----------------------------------------------------------------------

    def path_serialized(self) -> PathReport:
        report = self._begin(
            "serialized",
            f"Serialized path: {self.executions} payments of one account at once",
            f"in this process, {self.executions} threads",
        )
        return self._guarded(report, self._serialized)

    def _serialized(self, report: PathReport) -> None:
        account = self.open_account()
        key = reactors.account_key({"account_id": account.number})
        report.keys.append(key)
        amounts = [10 * (n + 1) for n in range(self.executions)]
        results: list[Any] = [None] * self.executions
        errors: list[BaseException] = []
        barrier = threading.Barrier(self.executions)

        def pay(index: int) -> None:
            try:
                barrier.wait(timeout=30)
                results[index] = reactors.PaymentReactor.run(
                    account_id=account.number, amount=amounts[index]
                )
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()  # this thread's connections only

        self.say(
            f"   account {account.number}: {self.executions} PaymentReactor.run() in parallel; "
            f"charge holds {key} for {reactors.CHARGE_SECONDS}s each"
        )
        report.started = timezone.now()
        threads = [
            threading.Thread(target=pay, args=(n,), name=f"payment-{n + 1}")
            for n in range(self.executions)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=self.execution_timeout)
        if errors:
            raise ShowcaseError(f"a payment raised {type(errors[0]).__name__}: {errors[0]}")
        ids = []
        for result in results:
            if result is None:
                raise ShowcaseError("a payment thread did not finish")
            self._label(report, result.execution_id)
            ids.append(str(result.execution_id))
            self.say(f"   {report.label(result.execution_id)} {result.status}")

        report.judge(
            f"all {self.executions} payments succeeded",
            all(r.ok for r in results),
            ", ".join(f"{report.label(r.execution_id)} {r.status}" for r in results),
        )
        self._serialization_verdicts(report, ids, account, amounts)
        zero = report.started
        for step in ("audit", "notify"):
            bodies = self._bodies(ids, step)
            pairs = overlapping(bodies)
            report.judge(
                f"{step} bodies overlapped (the lock covers charge only)",
                bool(pairs),
                f"{len(pairs)} overlapping pairs: "
                + self._describe_intervals(report, bodies, zero),
            )

    # -- 2. contended -----------------------------------------------------------------------

    def path_contended(self) -> PathReport:
        title = f"Contended path: {self.executions} payments of one account on Celery workers"
        return self._guarded(self._begin("contended", title, "Celery workers"), self._contended)

    def _contended(self, report: PathReport) -> None:
        account = self.open_account()
        key = reactors.account_key({"account_id": account.number})
        report.keys.append(key)
        amounts = [5 * (n + 1) for n in range(self.executions)]
        report.started = timezone.now()
        first = reactors.PaymentReactor.run_async(account_id=account.number, amount=amounts[0])
        self._label(report, first.id)
        self.say(f"   P1 dispatched; waiting until it holds {key} in charge")

        def holding() -> LockState | None:
            lock = self.state.lock(key)
            return lock if lock.held and lock.execution == str(first.id) else None

        held = poll(holding, self.execution_timeout, f"P1 to hold {key}")
        report.observe(f"when the others were dispatched, {key} was {describe_lock(held)}")
        self.say(
            f"   {key} is held by P1 (step {held.step!r}, token {held.token}); dispatching the rest"
        )
        executions = [first]
        for amount in amounts[1:]:
            execution = reactors.PaymentReactor.run_async(account_id=account.number, amount=amount)
            self._label(report, execution.id)
            executions.append(execution)
        ids = [str(e.id) for e in executions]
        parked = poll(
            lambda: ContentionState.objects.filter(execution_id__in=ids, key=key).first(),
            self.execution_timeout,
            f"a payment to park on {key}",
        )
        blocker = parked.blocker or {}
        observed = report.observe(
            f"{report.label(parked.execution_id)} parked on {parked.primitive} {key} "
            f"(attempt {parked.attempts}); blocker: execution "
            f"{report.label(blocker.get('execution'))} step {blocker.get('step')!r}"
        )
        self.say(f"   {observed}")
        results = self._wait_all(report, executions)

        pids = {i.pid for i in self._bodies(ids, "charge")}
        report.judge(
            f"all {self.executions} payments succeeded, on worker processes",
            all(r.ok for r in results) and os.getpid() not in pids and bool(pids),
            ", ".join(f"{report.label(r.execution_id)} {r.status}" for r in results)
            + f"; charge bodies ran in pids {sorted(pids)} (this process is {os.getpid()})",
        )
        rows = list(ContentionState.objects.filter(execution_id__in=ids, key=key))
        parks = list(
            CoordinationEvent.objects.filter(
                execution_id__in=ids, key=key, kind=CoordinationEventKind.PARKED
            ).order_by("at")
        )
        report.judge(
            "a payment that found the key held was parked and requeued, not failed",
            bool(rows) and bool(parks) and all(r.attempts >= 1 for r in rows),
            "; ".join(
                f"{report.label(r.execution_id)} parked {r.attempts}x on {r.primitive} {r.key} "
                f"(blocker {report.label((r.blocker or {}).get('execution'))})"
                for r in rows
            )
            or "no payment parked",
        )
        woken, described = self._wake_evidence(report, ids, key)
        report.judge(
            "a parked payment was woken by the release (before its backoff requeue was due)",
            woken,
            described,
        )
        compensations = StepRun.objects.filter(execution_id__in=ids).exclude(kind=StepRunKind.RUN)
        retried = StepRun.objects.filter(execution_id__in=ids, status=StepRunStatus.RETRIED)
        errors = Execution.objects.filter(pk__in=ids, error__isnull=False).count()
        refunds = self._bodies(ids, "charge", kind="undo")
        report.judge(
            "contention cost nothing: no compensation or undo, no failure retry, no error",
            not compensations.exists() and not retried.exists() and not errors and not refunds,
            f"{compensations.count()} compensate/undo step runs, {retried.count()} retried "
            f"attempts, {errors} executions with an error, {len(refunds)} refunds",
        )
        self._serialization_verdicts(report, ids, account, amounts)

    def _wake_evidence(self, report: PathReport, ids: Sequence[str], key: str) -> tuple[bool, str]:
        """Each park → resume of ``key``: was the resume earlier than the park's backoff
        requeue (so the release re-enqueued it)?"""
        events = list(
            CoordinationEvent.objects.filter(execution_id__in=ids, key=key).order_by("at", "id")
        )
        releases = [e for e in events if e.kind == CoordinationEventKind.RELEASED]
        lines = []
        woken = False
        for index, park in enumerate(events):
            if park.kind != CoordinationEventKind.PARKED:
                continue
            resume = next(
                (
                    e
                    for e in events[index + 1 :]
                    if e.kind == CoordinationEventKind.RESUMED
                    and e.execution_id == park.execution_id
                ),
                None,
            )
            if resume is None:
                continue
            due = park.at + timedelta(seconds=float(park.detail.get("requeue_in") or 0))
            release = next((r for r in reversed(releases) if park.at <= r.at <= resume.at), None)
            early = resume.at < due and release is not None
            woken = woken or early
            since = (
                f"{_seconds(resume.at, release.at):.3f}s after "
                f"{report.label(release.execution_id)} released it"
                if release is not None
                else "with no release in between"
            )
            lines.append(
                f"{report.label(park.execution_id)} resumed {since}, "
                f"{_seconds(due, resume.at):.2f}s before its backoff requeue was due"
                if early
                else f"{report.label(park.execution_id)} resumed {since}, by its backoff requeue"
            )
        return woken, "; ".join(lines) or "no park was followed by a resume"

    # -- 3. compensated ---------------------------------------------------------------------

    def path_compensated(self) -> PathReport:
        title = "Compensated path: a failed receipt refunds the charge under the account key"
        return self._guarded(self._begin("compensated", title, "Celery workers"), self._compensated)

    def _compensated(self, report: PathReport) -> None:
        account = self.open_account()
        key = reactors.account_key({"account_id": account.number})
        report.keys.append(key)
        report.started = timezone.now()
        faxed = reactors.FaxedPaymentReactor.run_async(account_id=account.number, amount=25)
        self._label(report, faxed.id)
        self.say("   P1 (receipt by fax, which fails) dispatched; waiting for its rollback")
        poll(
            lambda: StepRun.objects.filter(
                execution_id=faxed.id, step="charge", kind=StepRunKind.UNDO
            ).exists(),
            self.execution_timeout,
            "P1's charge to be undone",
        )
        during = self.state.lock(key)
        self.say(f"   {report.observe(f'while P1 refunded, {key} was {describe_lock(during)}')}")
        other = reactors.PaymentReactor.run_async(account_id=account.number, amount=15)
        self._label(report, other.id)
        self.say("   P2 (a normal payment of the same account) dispatched during the refund")
        faxed_result, other_result = self._wait_all(report, [faxed, other])

        undo_runs = StepRun.objects.filter(execution_id=faxed.id, kind=StepRunKind.UNDO)
        faxed.refresh_from_db()
        failed_step = (faxed.error or {}).get("step")
        report.judge(
            "the faxed payment failed in notify and its charge was undone",
            faxed_result.status == ExecutionStatus.FAILED
            and failed_step == "notify"
            and [(r.step, r.status) for r in undo_runs] == [("charge", StepRunStatus.SUCCEEDED)]
            and not faxed_result.rollback_failures,
            f"P1 {faxed_result.status} (error in step {failed_step!r}: "
            f"{(faxed.error or {}).get('message', '')}); undo step runs "
            f"{[(r.step, r.status) for r in undo_runs]}; rollback failures "
            f"{faxed_result.rollback_failures}",
        )

        refund = next(iter(self._bodies([faxed.id], "charge", kind="undo")), None)
        charge = next(iter(self._bodies([faxed.id], "charge")), None)
        hold = self._hold_around(key, str(faxed.id), refund)
        zero = report.started
        report.judge(
            "the undo ran while P1 held the account key again (a fresh hold, newer token)",
            refund is not None
            and hold is not None
            and during.held
            and during.execution == str(faxed.id)
            and charge is not None
            and (refund.token or 0) > (charge.token or 0),
            (
                f"P1's refund body {_seconds(refund.start, zero):.2f}-"
                f"{_seconds(refund.end, zero):.2f}s inside its hold of {key} "
                f"{hold}; charge token {charge.token if charge else None}, refund token "
                f"{refund.token}; live read during the refund: {describe_lock(during)}"
            )
            if refund is not None
            else "no refund body was recorded",
        )

        other_charge = next(iter(self._bodies([other.id], "charge")), None)
        contention = list(
            CoordinationEvent.objects.filter(
                execution_id=other.id,
                key=key,
                kind__in=[CoordinationEventKind.PARKED, CoordinationEventKind.ACQUISITION_FAILED],
            ).order_by("at")
        )
        during_refund = [
            e for e in contention if refund is not None and refund.start <= e.at <= refund.end
        ]
        report.judge(
            "the concurrent payment waited for the refund before charging",
            refund is not None
            and other_charge is not None
            and bool(during_refund)
            and other_charge.start >= refund.end,
            (
                f"P2 was refused/parked on {key} at "
                f"{', '.join(f'{_seconds(e.at, zero):.2f}s ({e.kind})' for e in contention)}, "
                f"during P1's refund {_seconds(refund.start, zero):.2f}-"
                f"{_seconds(refund.end, zero):.2f}s; P2's charge began at "
                f"{_seconds(other_charge.start, zero):.2f}s"
            )
            if refund is not None and other_charge is not None
            else "missing refund or charge bodies",
        )
        account.refresh_from_db()
        report.judge(
            "the account ends with only the successful payment charged",
            other_result.ok and account.balance == OPENING_BALANCE - 15,
            f"P2 {other_result.status}; balance {account.balance} "
            f"(expected {OPENING_BALANCE} - 15 = {OPENING_BALANCE - 15})",
        )

    @staticmethod
    def _hold_around(key: str, execution: str, body: Interval | None) -> str | None:
        """``"acquired a.aa-released b.bb (rollback)"`` of the hold of ``key`` by
        ``execution`` that contains ``body``, or None."""
        if body is None:
            return None
        events = CoordinationEvent.objects.filter(
            key=key, execution_id=execution, primitive="lock"
        ).order_by("at", "id")
        acquired: CoordinationEvent | None = None
        for event in events:
            if event.kind == CoordinationEventKind.ACQUIRED and acquired is None:
                acquired = event
            elif event.kind == CoordinationEventKind.RELEASED and acquired is not None:
                if acquired.at <= body.start and body.end <= event.at:
                    outcome = event.detail.get("outcome", "")
                    return (
                        f"(acquired {acquired.at:%H:%M:%S.%f}, token {acquired.token}; released "
                        f"{event.at:%H:%M:%S.%f}, outcome {outcome})"
                    )
                acquired = None
        return None

    # -- 4. period --------------------------------------------------------------------------

    def path_period(self) -> PathReport:
        report = self._begin(
            "period",
            "Period: the offer step runs once a day per account",
            "in this process",
        )
        return self._guarded(report, self._period)

    def _period(self, report: PathReport) -> None:
        account = self.open_account()
        key = f"offer:{account.number}"
        report.keys.append(key)
        report.started = timezone.now()
        first = reactors.StatementReactor.run(account_id=account.number)
        self._label(report, first.execution_id)
        marked_by = self.state.period_marked_by(key, "day")
        second = reactors.StatementReactor.run(account_id=account.number)
        self._label(report, second.execution_id)
        self.say(f"   P1 {first.status}: {first.value}")
        self.say(f"   P2 {second.status}: {second.value}")

        first_offer = StepRun.objects.filter(
            execution_id=str(first.execution_id), step="offer"
        ).first()
        report.judge(
            "the first statement ran the offer step and marked today's bucket",
            first.ok
            and first_offer is not None
            and first_offer.status == StepRunStatus.SUCCEEDED
            and marked_by == str(first.execution_id),
            f"P1 {first.status}, offer step {first_offer.status if first_offer else None}; "
            f"{key} day bucket marked by {report.label(marked_by)}",
        )
        second_offer = StepRun.objects.filter(
            execution_id=str(second.execution_id), step="offer"
        ).first()
        sent = StepRun.objects.filter(
            execution_id=str(second.execution_id), step="send", status=StepRunStatus.SUCCEEDED
        ).exists()
        reason = (second_offer.detail or {}).get("reason") if second_offer else None
        report.judge(
            "the second statement skipped the offer step and the workflow went on",
            second.status == ExecutionStatus.SUCCEEDED
            and second_offer is not None
            and second_offer.status == StepRunStatus.SKIPPED
            and reason == "period"
            and sent
            and len(self._bodies([second.execution_id], "offer")) == 0,
            f"P2 {second.status}; offer step {second_offer.status if second_offer else None} "
            f"(reason {reason!r}); send step ran: {sent}; value {second.value}",
        )

    # -- 5. rate limit ----------------------------------------------------------------------

    def path_rate_limit(self) -> PathReport:
        title = (
            f"Rate limit: 3 alerts, at most {reactors.SMS_LIMIT} texts per "
            f"{reactors.SMS_WINDOW}s per account"
        )
        return self._guarded(self._begin("rate_limit", title, "Celery workers"), self._rate)

    def _rate(self, report: PathReport) -> None:
        account = self.open_account()
        key = f"sms:{account.number}"
        report.keys.append(key)
        window = float(reactors.SMS_WINDOW)
        report.started = timezone.now()
        executions = []
        for _ in range(3):
            execution = reactors.LowBalanceAlertReactor.run_async(account_id=account.number)
            self._label(report, execution.id)
            executions.append(execution)
        ids = [str(e.id) for e in executions]
        self.say("   P1-P3 dispatched at once")
        parked = poll(
            lambda: ContentionState.objects.filter(execution_id__in=ids, key=key).first(),
            self.execution_timeout,
            f"an alert to park on {key}",
        )
        counted = self.state.rate_limit(key, window)
        observed = report.observe(
            f"while {report.label(parked.execution_id)} was parked, {key} counted {counted} "
            f"admissions in its {window:g}s window"
        )
        self.say(f"   {observed}")
        results = self._wait_all(report, executions)

        report.judge(
            "all 3 alerts succeeded",
            all(r.ok for r in results),
            ", ".join(f"{report.label(r.execution_id)} {r.status}" for r in results),
        )
        parks = list(
            CoordinationEvent.objects.filter(
                execution_id__in=ids, key=key, kind=CoordinationEventKind.PARKED
            )
        )
        failed = StepRun.objects.filter(execution_id__in=ids, status=StepRunStatus.FAILED)
        report.judge(
            "the alert over the limit parked until the window freed, instead of failing",
            bool(parks) and not failed.exists() and counted <= reactors.SMS_LIMIT,
            "; ".join(
                f"{report.label(p.execution_id)} parked on rate_limit {key}, requeued in "
                f"{p.detail.get('requeue_in')}s (the refusal's retry_after)"
                for p in parks
            )
            + f"; {failed.count()} failed step runs",
        )
        starts = sorted(i.start for i in self._bodies(ids, "text"))
        zero = report.started
        spans = [
            _seconds(starts[n + reactors.SMS_LIMIT], starts[n])
            for n in range(len(starts) - reactors.SMS_LIMIT)
        ]
        report.judge(
            f"no {window:g}s window admitted more than {reactors.SMS_LIMIT} texts",
            len(starts) == 3 and all(span >= window - ADMISSION_SLACK for span in spans),
            f"text bodies began at {', '.join(f'{_seconds(s, zero):.2f}s' for s in starts)}; "
            f"text n+{reactors.SMS_LIMIT} began {', '.join(f'{s:.2f}s' for s in spans)} after "
            f"text n (window {window:g}s, admission precedes the body by a few ms)",
        )
