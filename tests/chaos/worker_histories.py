"""Helpers of the fault schedules on real workers (``test_worker_fault_histories``: holders
SIGKILLed; ``test_worker_restart_histories``: the coordination Redis restarted empty;
``test_worker_lost_replies``: script replies lost; ``test_worker_failover_histories``: a
Sentinel failover): the plan of executions, the settings their worker and the test share,
and each key's history as the bodies of ``worker_fault_reactors`` saw it, with the model it is
checked against.

A recorded name is a primitive at a level: ``lock`` … ``ordered`` are step-level,
``reactor_lock`` … ``reactor_ordered`` reactor-level, ``fenced_lock`` a step lock whose holder
writes a row through ``fenced_update`` (its writes are checked as a fenced register).
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reactor_app.testing.history import CLOCK, Operation
from reactor_app.testing.linearizability import Model
from reactor_app.testing.sequential_models import (
    FencedRegisterModel,
    MutexModel,
    PeriodModel,
    RateLimitModel,
    SemaphoreModel,
)
from tests.chaos.fault_histories import assert_watched
from tests.chaos.worker_fault_reactors import (
    LEASE,
    RATE,
    REACTORS,
    SLOTS,
    WINDOW,
    primitive_of,
)

#: what the workers of both schedules run with: short claims and sweeps, so that killed (or
#: claim-less) deliveries come back within the run (claim TTL 3 s: longer than every lease)
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
    # connects the delivery recorder in the worker before its pool forks
    "CELERY_IMPORTS": ["tests.chaos.worker_fault_reactors"],
}

#: the row the fenced lock's holders write
FENCED_ACCOUNT = 3131

#: seconds a body holds its key (below every lease); a semaphore's longer, so that a third
#: holder a broken limit let in overlaps two others often enough for the check to see it
HOLDS = {"semaphore": (0.3, 0.6)}

SETTLED = ("succeeded", "failed", "cancelled", "halted")

#: executions per recorded name (and keys) of one round of a schedule that loses the
#: coordination state (a restart, a failover): every primitive at step and reactor level, and
#: a fenced step lock
LOST_STATE_PLAN = {
    "lock": (5, 1),
    "semaphore": (5, 1),
    "rate_limit": (6, 1),
    "period": (6, 2),
    "ordered": (5, 1),
    "reactor_lock": (4, 1),
    "reactor_semaphore": (5, 1),
    "reactor_rate_limit": (5, 1),
    "reactor_period": (4, 2),
    "reactor_ordered": (4, 1),
    "fenced_lock": (6, 1),
}


def wait_settled(enqueued: Iterable[str], within: float) -> None:
    """Wait until every execution of ``enqueued`` ended; fail past ``within`` seconds (the
    recovery bound), naming what is still running."""
    from reactor_app.models import Execution

    end = time.monotonic() + within
    pending = Execution.objects.filter(pk__in=list(enqueued)).exclude(status__in=SETTLED)
    while pending.exists():
        assert time.monotonic() < end, (
            "executions still running past the recovery bound: "
            f"{list(pending.values_list('status', 'current_step'))}"
        )
        time.sleep(0.2)


def worker_settings(directory: Path, **more: Any) -> dict[str, Any]:
    """``WORKER_SETTINGS`` plus the file the workers append delivery starts to."""
    return {**WORKER_SETTINGS, "FAULT_DELIVERIES_FILE": str(directory / "deliveries"), **more}


def is_ordered(name: str) -> bool:
    return primitive_of(name) == "ordered"


def is_period(name: str) -> bool:
    return primitive_of(name) == "period"


def model_for(name: str, *, lost_state: bool = False) -> Model:
    """The model of a recorded name. ``lost_state``: a schedule that empties the store (an
    ordered lock's line restarted empty numbers its positions again; tokens survive)."""
    level = "reactor" if name.startswith("reactor_") else "step"
    primitive = primitive_of(name)
    noun = {"ordered": "ordered lock", "rate_limit": "rate limit"}.get(primitive, primitive)
    label = f"{level} {'fenced ' if name.startswith('fenced_') else ''}{noun} on workers"
    if primitive == "lock":
        return MutexModel(name=label)
    if primitive == "semaphore":
        return SemaphoreModel(name=label, limit=SLOTS)
    if primitive == "rate_limit":
        return RateLimitModel(name=label)
    if primitive == "period":
        return PeriodModel(name=label)
    assert primitive == "ordered", name
    return MutexModel(name=label, order_field="position", order_survives_loss=not lost_state)


def enqueue(
    plan: dict[str, tuple[int, int]], rounds: int, path: Path, rng: random.Random
) -> tuple[list[tuple[str, str]], dict[str, tuple[str, int]]]:
    """Executions of ``plan`` (recorded name -> (executions, keys) per round), each round on
    keys of its own, enqueued interleaved. Returns the (name, key) plan and ``execution ->
    (name, enqueued at)``."""
    runs = []
    for _ in range(rounds):
        for name, (count, keys) in plan.items():
            stem = f"{name}:{secrets.token_hex(3)}"
            runs += [(name, f"{stem}:{n % keys}") for n in range(count)]
    rng.shuffle(runs)
    enqueued: dict[str, tuple[str, int]] = {}
    for name, key in runs:
        at = time.monotonic_ns()
        hold = rng.uniform(*HOLDS.get(primitive_of(name), (0.1, 0.3)))
        inputs: dict[str, Any] = {"key": key, "history": str(path), "hold": hold}
        if name == "fenced_lock":
            inputs["account"] = FENCED_ACCOUNT
        execution = REACTORS[name].run_async(**inputs)
        enqueued[str(execution.id)] = (name, at)
    return runs, enqueued


def worker_histories(
    ops: list[Operation], enqueued: dict[str, tuple[str, int]], started: dict[int, list[int]]
) -> dict[str, list[Operation]]:
    """Each recorded name's history as its bodies saw it (and ``"fenced row"``: the fenced
    lock's writes). An admission is placed from the latest moment the execution is known to
    have been before it — the start of the delivery running the body (``started``: the
    latest task start of the body's process before it; a reactor-level admission is made in
    that delivery too, as these reactors never park after it), ``Reached`` (the step before
    a step-level primitive) done, the enqueue — to its body's start, with what the body was
    given (token, position, bucket) and the claim's lease or window; a rate limit's admission
    is its charge, spent even when the body is killed — at reactor level once per run, its
    redeliveries' bodies continuing that admission. Releases (a period's complete) are
    invoked at the body's end and left open: the worker releases after the body, and may be
    killed first. A nemesis's ``lose`` (the store restarted empty) concerns every key."""
    claims: dict[str, dict[str, Any]] = {
        "lock": {"ttl": LEASE},
        "semaphore": {"ttl": LEASE, "limit": SLOTS},
        "rate_limit": {"window": WINDOW, "limit": RATE, "cost": 1},
        "period": {"ttl": LEASE},
        # a silent holder is passed over after the poison pill: that is its lease
        "ordered": {"ttl": LEASE},
    }
    reached: dict[str, list[int]] = {}
    for o in ops:
        if o.f == "reached" and o.ret is not None:
            reached.setdefault(o.value["execution"], []).append(o.ret)
    names = {name for name, _ in enqueued.values()}
    histories: dict[str, list[Operation]] = {name: [] for name in names}
    name_of = {o.value["session"]: o.value["primitive"] for o in ops if o.f == "entered"}

    def holder(session: str) -> str:
        # an ordered lock's hold is the execution's place in line, kept across deliveries: a
        # redelivery after a kill resumes it (same position); every other hold is one admission
        if is_ordered(name_of[session]):
            return session.split(":")[0]
        return session

    keys: dict[str, str] = {}  # session -> the key its operations are checked under
    charged: set[str] = set()  # executions a reactor-level rate limit has charged
    for o in ops:
        if o.f != "entered" or o.status != "ok":
            continue
        execution, name = o.value["execution"], o.value["primitive"]
        if name == "reactor_rate_limit":
            # a run is charged once: a redelivery's body continues the first admission,
            # which the engine records before the first body (docs/coordination.md)
            if execution in charged:
                continue
            charged.add(execution)
        before = [t for t in reached.get(execution, []) if t <= o.call]
        before += [t for t in started.get(o.value["pid"], []) if t <= o.call]
        call = max([enqueued[execution][1], *before])
        key = f"{o.key}@{o.value['bucket']}" if is_period(name) else str(o.key)
        keys[o.value["session"]] = key
        seen = {k: o.value[k] for k in ("token", "position") if o.value.get(k) is not None}
        session = holder(o.value["session"])
        histories[name].append(
            Operation(
                o.id,
                o.process,
                "admit" if is_period(name) else "acquire",
                key,
                "ok",
                call,
                o.ret,
                {"session": session, **claims[primitive_of(name)], **seen},
            )
        )
    for o in ops:
        if o.f in ("release", "complete") and o.value["session"] in keys:
            session = o.value["session"]
            value = {**o.value, "session": holder(session)}
            histories[name_of[session]].append(
                Operation(o.id, o.process, o.f, keys[session], o.status, o.call, o.ret, value)
            )
    # the nemesis's faults, and the ClockWatch's step of the server's clock
    assert_watched(ops)
    faults = [o for o in ops if o.key is None and o.f in ("lose", CLOCK)]
    for history in histories.values():
        history += faults
    writes = [o for o in ops if o.f == "write"]
    if writes:
        histories["fenced row"] = writes
    return histories


def models_for(histories: dict[str, list[Operation]], *, lost_state: bool = False) -> dict:
    """The model of each history ``worker_histories`` returned."""
    return {
        name: FencedRegisterModel()
        if name == "fenced row"
        else model_for(name, lost_state=lost_state)
        for name in histories
    }
