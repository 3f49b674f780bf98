"""Chaos (a): worker children killed at random while 40 executions contend for one key.

Two worker processes (one ``celery worker -c 2``) run 40 executions whose ``guarded`` step
takes one lock; every second for 15 s a random worker child is SIGKILLed, wherever it is — in
a body, between admission and body, while parking, or idle. Afterwards, with no manual sweep:
every execution ended ``succeeded``, no two completed critical sections overlap, the fencing
tokens of the completed ones increase in time order, nothing is left ``running``,
``parked`` or ``pending`` within the recovery bound docs/operations.md states for the settings
below (claim TTL + sweep interval + sweep-after, plus the backoff), and the key's waiter line is
empty: no finished execution is left in it, in either of its forms (``<id>``, ``wait:<id>``).
Nor was the key ever handed to one during the run: each release's ``released`` event names the
waiter the freed key went to (``handed_to``), and every such waiter's execution still had an
admission to come — a key granted to an execution past its last admission sits idle for the
whole grant (``HANDOFF_GRANT_MS``, 3 s), nobody coming to take it. The release → next
acquisition gaps are printed (``-s``) for the record, with the grants that lapsed (a grantee
killed before it took the key: its redelivery comes only after its claim TTL).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import LockClaim
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.status import CoordinationEventKind, ExecutionStatus
from reactor_app.testing import assert_not_locked
from reactor_app.write_behind import flush
from tests.worker.helpers import overlapping, wait_until
from tests.worker.reactors import records
from tests.worker.trust_reactors import ChaosReactor

pytestmark = [pytest.mark.chaos, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

WORKER_SETTINGS = {
    "REACTOR_CONTENTION_CEILING": 1000,
    "REACTOR_CONTENTION_BACKOFF": [0.2, 1.0],
    "REACTOR_EXECUTION_CLAIM_TTL": 3,
    "REACTOR_SWEEP_INTERVAL": 1,
    "REACTOR_SWEEP_AFTER": 5,
    # the schedule kills (or takes the claim of) one execution's deliveries again and again on
    # purpose: the lost-delivery guard would rightly fail one killed three times at one point,
    # which is not what this checks (tests/worker/test_lost_deliveries.py checks the guard)
    "REACTOR_LOST_DELIVERY_LIMIT": 0,
}

EXECUTIONS = 40
KILLING_FOR = 15.0
#: the documented bound for these settings, with room for a loaded 2-core machine
SETTLED_WITHIN = 120.0


def worker_children(pid: int) -> list[int]:
    """The pool processes of a prefork worker (Linux: the kernel's list of children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(child) for child in text)
    return found


def hand_off_gaps(key: str) -> list[float]:
    """Seconds from each release of ``key`` to the next acquisition, from the recorded events
    (a killed holder records no release: its lease lapsing is not a hand-off)."""
    flush()
    events = list(
        CoordinationEvent.objects.filter(
            key=key,
            kind__in=[CoordinationEventKind.RELEASED, CoordinationEventKind.ACQUIRED],
        )
        .order_by("at")
        .values_list("kind", "at")
    )
    gaps = []
    for (kind, at), (next_kind, next_at) in itertools.pairwise(events):
        if kind == CoordinationEventKind.RELEASED and next_kind == CoordinationEventKind.ACQUIRED:
            gaps.append((next_at - at).total_seconds())
    return gaps


#: how much earlier than the release that named it a grantee's admission may be stamped: the
#: two stamps are taken in two processes after their scripts returned, so a preempted releaser
#: can stamp its release after the admission the grant led to (not a hand-off to the past)
STAMP_SLACK = 0.5


def grants_past_last_admission(key: str) -> tuple[list[tuple[str, Any, Any]], int, int]:
    """The hand-offs of ``key`` to a waiter whose execution had no admission left to come
    (``(waiter, released at, its last admission)``), the number of hand-offs, and how many of
    them lapsed (the grantee's next admission not before the next release)."""
    flush()
    events = list(
        CoordinationEvent.objects.filter(
            key=key,
            kind__in=[CoordinationEventKind.RELEASED, CoordinationEventKind.ACQUIRED],
        )
        .order_by("at")
        .values_list("kind", "at", "execution_id", "detail")
    )
    admissions: dict[str, list[Any]] = {}
    for kind, at, execution_id, _ in events:
        if kind == CoordinationEventKind.ACQUIRED:
            admissions.setdefault(str(execution_id), []).append(at)
    stranded, handed, lapsed = [], 0, 0
    for index, (kind, at, _, detail) in enumerate(events):
        if kind != CoordinationEventKind.RELEASED:
            continue
        for waiter in (detail or {}).get("handed_to", []):
            handed += 1
            taken = [t for t in admissions.get(waiter.removeprefix("wait:"), []) if t >= at]
            last = max(admissions.get(waiter.removeprefix("wait:"), []), default=None)
            if last is None or last < at - timedelta(seconds=STAMP_SLACK):
                stranded.append((waiter, at, last))
            following = [e[1] for e in events[index + 1 :] if e[0] == kind]
            if not taken or (following and min(taken) > following[0]):
                lapsed += 1
    return stranded, handed, lapsed


def test_killing_worker_children_every_second_strands_nothing_and_never_overlaps(
    worker: Any,
) -> None:
    executions = [ChaosReactor.run_async(key="one") for _ in range(EXECUTIONS)]
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + KILLING_FOR
    while time.monotonic() < deadline:
        time.sleep(1.0)
        children = worker_children(worker.process.pid)
        if children:
            try:
                os.kill(rng.choice(children), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
    assert kills >= 10, f"only {kills} kills in {KILLING_FOR}s"

    ids = [e.id for e in executions]
    wait_until(
        lambda: (
            not Execution.objects.filter(pk__in=ids)
            .exclude(status__in=[ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED])
            .exists()
        ),
        SETTLED_WITHIN,
        interval=0.5,
        message="executions still running/parked/pending past the recovery bound",
    )
    statuses = list(Execution.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == [ExecutionStatus.SUCCEEDED] * EXECUTIONS

    done = records("chaos")  # completed critical sections only: a killed body records no end
    assert len({r["execution"] for r in done}) == EXECUTIONS
    assert overlapping(done) == []
    tokens = [r["token"] for r in sorted(done, key=lambda r: r["start"])]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert_not_locked("chaos:one")
    # nobody is left in the key's line (no finished execution, in either of its forms)
    assert Coordinator().waiters(LockClaim("chaos:one")) == []
    stranded, handed, lapsed = grants_past_last_admission("chaos:one")
    assert handed > 0  # the releases name whom they handed the key to
    assert stranded == []
    gaps = hand_off_gaps("chaos:one")
    print(f"\nhand-off gaps, ms: {sorted(round(g * 1000, 1) for g in gaps)}")
    print(f"hand-offs to a waiter: {handed}, of which lapsed (grantee killed): {lapsed}")
