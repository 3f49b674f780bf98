"""Reactors of the trust tests (``test_trust.py``), importable by the worker processes.

Bodies record into Redis lists under the current key prefix (``tests.worker.reactors.record``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from reactor_app import (
    Reactor,
    Retries,
    Step,
    Success,
    async_reactor,
    compose,
    from_input,
    from_result,
    step,
    with_lock,
)
from reactor_app.coordination.redis import get_client
from tests.worker.reactors import AuditStep, record, timed, trace_key

# --------------------------------------------------------------------------------------------
# a failure retry on a worker: its backoff is a requeue, not a sleep in the delivery


@with_lock(lambda args: f"retry:{args['key']}", ttl=30)
class FlakyLockedStep(Step):
    inputs = ("key",)
    retries = Retries(max_attempts=2, backoff="fixed", base_delay=3.0)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        attempt = get_client().incr(trace_key(f"attempts:{context.execution_id}"))
        record("flaky", execution=context.execution_id, attempt=context.attempt, at=time.time_ns())
        if attempt == 1:
            raise RuntimeError("the first attempt fails")
        return Success(attempt)


@with_lock(lambda inputs: f"retry-outer:{inputs['key']}", ttl=30)
class RetryReactor(Reactor):
    inputs = ("key",)

    flaky = step(FlakyLockedStep, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# a parked execution whose woken delivery died right after taking the claim


@with_lock(lambda args: f"strand:{args['key']}", ttl=30)
class StrandStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("strand", execution=context.execution_id)
        return Success("ran")


class StrandReactor(Reactor):
    inputs = ("key",)

    only = step(StrandStep, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# the hand-off guard for an async_reactor child keyed on a result


class EchoKeyStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        return Success(args["key"])


@with_lock(lambda args: f"guard:{args['key']}", ttl=30)
class GuardLockedStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("guarded", execution=context.execution_id)
        return Success("entered")


class GuardChild(Reactor):
    inputs = ("key",)

    derive = step(EchoKeyStep, key=from_input("key"))
    # known only once ``derive`` ran: the parent's guard cannot compute it at dispatch
    locked = step(GuardLockedStep, key=from_result("derive"))


@with_lock(lambda inputs: f"guard:{inputs['key']}", ttl=30)
class GuardParent(Reactor):
    inputs = ("key",)

    child = async_reactor(GuardChild, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# a crash inside a composed child: its holds are in the held-key registry


@with_lock(lambda args: f"composed-held:{args['key']}", ttl=30)
class ComposedFragileStep(Step):
    """Its lock outlives the killed delivery's claim (30 s vs the module's 4 s claim)."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        entries = get_client().incr(trace_key(f"entries:{context.root_execution_id}"))
        # the first entry waits to be killed; the redelivery passes quickly
        timed("composed", context, 60.0 if entries == 1 else 0.2, entry=entries)
        return Success({"entry": entries})


class FragileChild(Reactor):
    inputs = ("key",)

    fragile = step(ComposedFragileStep, key=from_input("key"))


class ComposedCrashReactor(Reactor):
    inputs = ("key",)

    before = step(AuditStep, account_id=from_input("key"))
    child = compose(FragileChild, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# chaos: many executions on one key while worker children are killed


@with_lock(lambda args: f"chaos:{args['key']}", ttl=3)
class ChaosStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("chaos", context, 0.05, token=context.fencing_token())
        return Success("done")


class ChaosReactor(Reactor):
    inputs = ("key",)

    before = step(AuditStep, account_id=from_input("key"))
    guarded = step(ChaosStep, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# chaos: the coordination Redis restarted empty while executions are in flight. Bodies record
# into the database (the Redis they would record into is the one that gets wiped).


@with_lock(lambda args: f"fenced:{args['number']}", ttl=3)
class FencedDepositStep(Step):
    inputs = ("number",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        from django.db.models import F
        from django.utils import timezone

        from demo_project.shop.models import Account, Activity
        from reactor_app.fencing import fenced_update

        started = timezone.now()
        time.sleep(0.05)
        token = context.fencing_token()
        accounts = Account.objects.filter(number=args["number"])
        accepted = fenced_update(accounts, token, balance=F("balance") + 1)
        Activity.objects.create(
            execution_id=context.execution_id,
            step="deposit",
            account_number=args["number"],
            fencing_token=token,
            pid=os.getpid(),
            started_at=started,
            finished_at=timezone.now(),
            detail={"accepted": accepted},
        )
        if not accepted:
            raise RuntimeError(f"fenced write with token {token} refused: a stale holder")
        return Success(token)


class FencedDepositReactor(Reactor):
    inputs = ("number",)

    deposit = step(FencedDepositStep, number=from_input("number"))


# --------------------------------------------------------------------------------------------
# contention on a worker: a brief in-delivery wait before parking


@with_lock(lambda args: f"queue:{args['key']}", ttl=30)
class QueuedStep(Step):
    inputs = ("key", "hold")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("queued", context, float(args["hold"]), key=args["key"])
        return Success("done")


class QueuedReactor(Reactor):
    inputs = ("key", "hold")

    only = step(QueuedStep, key=from_input("key"), hold=from_input("hold"))
