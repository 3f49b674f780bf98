"""Reactors and steps run by the worker tests, importable by the worker processes.

Step bodies record what they did into Redis lists under the current ``REACTOR_KEY_PREFIX``
(``trace_key(...)``): enter/exit times in ``time.time_ns()`` (one machine, so comparable across
processes) and the pid of the process that ran them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from reactor_app import (
    Reactor,
    Step,
    Success,
    async_reactor,
    async_step,
    compose,
    from_input,
    from_result,
    interrupt,
    step,
    with_lock,
    with_ordered_lock,
    with_period,
    with_rate_limit,
    with_semaphore,
)
from reactor_app.conf import reactor_settings
from reactor_app.coordination.redis import get_client


def trace_key(name: str) -> str:
    return f"{reactor_settings.KEY_PREFIX}:test:{name}"


def record(name: str, **data: Any) -> None:
    get_client().rpush(trace_key(name), json.dumps(data))


def records(name: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in get_client().lrange(trace_key(name), 0, -1)]


def timed(label: str, context: Any, seconds: float, **extra: Any) -> dict[str, Any]:
    """Sleep ``seconds`` inside a step body, recording enter (at once) and the full interval."""
    start = time.time_ns()
    record(f"enter:{label}", execution=context.execution_id, pid=os.getpid(), start=start)
    time.sleep(seconds)
    end = time.time_ns()
    entry = {
        "execution": context.execution_id,
        "pid": os.getpid(),
        "thread": threading.get_ident(),  # a worker slot of a threads pool
        "start": start,
        "end": end,
    }
    record(label, **entry, **extra)
    return entry


def account_key(args: dict[str, Any]) -> str:
    return f"acct:{args['account_id']}"


# --------------------------------------------------------------------------------------------
# a payment: audit → charge (step lock on the account) → notify


class AuditStep(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("audit", context, 0.05)
        return Success("audited")

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("rollback", step="audit", kind="undo", execution=context.execution_id)


@with_lock(account_key, ttl=30)
class ChargeStep(Step):
    inputs = ("account_id", "hold")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("charge", context, float(args["hold"]), token=context.fencing_token())
        return Success({"charged": args["account_id"]})

    def compensate(self, error: BaseException, args: dict[str, Any], context: Any) -> None:
        record("rollback", step="charge", kind="compensate", execution=context.execution_id)

    def undo(self, result: Any, args: dict[str, Any], context: Any) -> None:
        record("rollback", step="charge", kind="undo", execution=context.execution_id)


class NotifyStep(Step):
    inputs = ("charge",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("notify", context, 0.01)
        return Success("sent")


class PaymentReactor(Reactor):
    inputs = ("account_id", "hold")

    audit = step(AuditStep, account_id=from_input("account_id"))
    charge = step(ChargeStep, account_id=from_input("account_id"), hold=from_input("hold"))
    notify = step(NotifyStep, charge=from_result("charge"))

    returns = "charge"


# --------------------------------------------------------------------------------------------
# crash safety: the first delivery to enter the locked step is killed by the test


@with_lock(lambda args: f"crash:{args['key']}", ttl=2)
class FragileStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        entries = get_client().incr(trace_key(f"entries:{context.execution_id}"))
        # the first entry waits to be killed; the redelivery passes quickly
        timed("fragile", context, 60.0 if entries == 1 else 0.2, entry=entries)
        return Success({"entry": entries})


class CrashReactor(Reactor):
    inputs = ("key",)

    before = step(AuditStep, account_id=from_input("key"))
    fragile = step(FragileStep, key=from_input("key"))


@with_lock(lambda args: f"crash-held:{args['key']}", ttl=30)
class LongLeaseFragileStep(FragileStep):
    """FragileStep whose lock outlives the killed delivery's claim (30 s vs the claim's 6 s):
    the redelivery finds the dead delivery's hold still there."""


@with_lock(lambda inputs: f"crash-outer:{inputs['key']}", ttl=30)
class LongLeaseCrashReactor(Reactor):
    inputs = ("key",)

    before = step(AuditStep, account_id=from_input("key"))
    fragile = step(LongLeaseFragileStep, key=from_input("key"))


class FirstEntryKilledStep(Step):
    """Per key, the first entry waits to be killed; later entries (the killed one's
    redelivery, another execution's) pass quickly."""

    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        entries = get_client().incr(trace_key(f"key-entries:{args['key']}"))
        timed("first-killed", context, 60.0 if entries == 1 else 0.2, entry=entries)
        return Success({"entry": entries})


@with_period(lambda inputs: f"crash-period:{inputs['key']}", every="day", ttl=2)
class CrashPeriodReactor(Reactor):
    """A reactor-level period whose first holder is killed mid-body, in its first step."""

    inputs = ("key",)

    fragile = step(FirstEntryKilledStep, key=from_input("key"))


@with_period(lambda inputs: f"crash-period:{inputs['key']}", every="day", ttl=2)
class CrashPeriodAfterAStepReactor(Reactor):
    """The same, killed in its second step: the first one completed."""

    inputs = ("key",)

    before = step(AuditStep, account_id=from_input("key"))
    fragile = step(FirstEntryKilledStep, key=from_input("key"))


@with_rate_limit(lambda inputs: f"crash-rate:{inputs['key']}", limit=5, period=60)
class CrashRateLimitReactor(Reactor):
    """A reactor-level rate limit whose first run is killed mid-body."""

    inputs = ("key",)

    fragile = step(FirstEntryKilledStep, key=from_input("key"))


# --------------------------------------------------------------------------------------------
# reactor-level holds kept across a park in a step (docs/design.md §2.8)


def exclusive_key(values: dict[str, Any]) -> str:
    return f"excl:{values['key']}"


@with_lock(lambda args: f"side:{args['side']}", ttl=30)
class SideLockedStep(Step):
    """A step lock on ``side:<side>`` inside the reactor-level ``excl:<key>``; records the
    fencing token of the reactor-level lock it runs under."""

    inputs = ("key", "side")

    def run(self, args: dict[str, Any], context: Any) -> Any:
        token = context.fencing_token(exclusive_key(args))
        timed("side", context, 0.05, token=token)
        return Success({"side": args["side"], "token": token})


class FailingSideStep(SideLockedStep):
    """The same step lock; its body fails (after the execution resumed from its park)."""

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("side", context, 0.01, token=context.fencing_token(exclusive_key(args)))
        raise RuntimeError("side effect refused")


@with_lock(exclusive_key, ttl=30)
class ExclusiveReactor(Reactor):
    """ "This whole workflow is exclusive" per key, with a step lock of its own inside."""

    inputs = ("key", "side")

    audit = step(AuditStep, account_id=from_input("key"))
    side = step(SideLockedStep, key=from_input("key"), side=from_input("side"))


@with_lock(exclusive_key, ttl=0.9)
class BriefLeaseReactor(Reactor):
    """The same with a reactor-level lease shorter than the park (1-2 s in its test module)."""

    inputs = ("key", "side")

    audit = step(AuditStep, account_id=from_input("key"))
    side = step(SideLockedStep, key=from_input("key"), side=from_input("side"))


@with_semaphore(lambda inputs: f"pool:{inputs['key']}", limit=1, ttl=30)
class PooledReactor(Reactor):
    """A reactor-level semaphore slot instead of a lock."""

    inputs = ("key", "side")

    audit = step(AuditStep, account_id=from_input("key"))
    side = step(SideLockedStep, key=from_input("key"), side=from_input("side"))


@with_lock(exclusive_key, ttl=30)
class ExclusiveFailingReactor(Reactor):
    inputs = ("key", "side")

    audit = step(AuditStep, account_id=from_input("key"))
    side = step(FailingSideStep, key=from_input("key"), side=from_input("side"))


# --------------------------------------------------------------------------------------------
# an ordered lock on a step (waits are never capped by the contention ceiling)


@with_ordered_lock(lambda args: f"line:{args['key']}", poison_pill_timeout=3)
class InLineStep(Step):
    inputs = ("key",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("in_line", context, 0.01)
        return Success("passed")


class OrderedReactor(Reactor):
    inputs = ("key",)

    pass_line = step(InLineStep, key=from_input("key"))


class PassStep(Step):
    inputs = ("n",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("passed", n=args["n"], execution=context.execution_id)
        time.sleep(0.02)
        return Success(args["n"])


@with_ordered_lock(lambda inputs: f"queue:{inputs['key']}", poison_pill_timeout=30, strict=False)
class EnqueueOrderedReactor(Reactor):
    """A reactor-level ordered lock: runs pass in the order they were enqueued."""

    inputs = ("key", "n")

    pass_ = step(PassStep, n=from_input("n"))


# --------------------------------------------------------------------------------------------
# hand-offs


class PrepareStep(Step):
    inputs = ("account_id",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("prepare", context, 0.01)
        return Success({"prepared": args["account_id"]})


class AsyncPaymentReactor(Reactor):
    """charge runs in its own task, under its own lock owned by that task."""

    inputs = ("account_id", "hold")

    prepare = step(PrepareStep, account_id=from_input("account_id"))
    charge = async_step(
        ChargeStep,
        account_id=from_input("account_id"),
        hold=from_input("hold"),
        result_timeout=60,
    )
    notify = step(NotifyStep, charge=from_result("charge"))

    returns = "charge"


@with_lock(account_key, ttl=30)
class DeadlockingReactor(Reactor):
    """Holds acct:<id> at reactor level, then hands a step declaring the same key to a worker."""

    inputs = ("account_id", "hold")

    prepare = step(PrepareStep, account_id=from_input("account_id"))
    charge = async_step(ChargeStep, account_id=from_input("account_id"), hold=from_input("hold"))


@with_lock(account_key, ttl=30)
class ChildPaymentReactor(Reactor):
    inputs = ("account_id", "hold")

    charge = step(ChargeStep, account_id=from_input("account_id"), hold=from_input("hold"))


@with_lock(account_key, ttl=30)
class DeadlockingParentReactor(Reactor):
    """Holds acct:<id>, then hands a child reactor locking the same key to a worker."""

    inputs = ("account_id", "hold")

    child = async_reactor(
        ChildPaymentReactor, account_id=from_input("account_id"), hold=from_input("hold")
    )


class ParentReactor(Reactor):
    inputs = ("account_id", "hold")

    child = async_reactor(
        ChildPaymentReactor,
        account_id=from_input("account_id"),
        hold=from_input("hold"),
        result_timeout=60,
    )
    notify = step(NotifyStep, charge=from_result("child"))


class NarrowedReactor(Reactor):
    """The same hand-off without an outer hold: allowed."""

    inputs = ("account_id", "hold")

    charge = async_step(ChargeStep, account_id=from_input("account_id"), hold=from_input("hold"))


# --------------------------------------------------------------------------------------------
# background and interrupts


class PidStep(Step):
    inputs = ("label",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        record("pids", label=args["label"], pid=os.getpid(), execution=context.execution_id)
        return Success(os.getpid())


class AfterFirstReactor(Reactor):
    inputs = ("first_label", "second_label")
    background = "after:first"

    first = step(PidStep, label=from_input("first_label"))
    second = step(PidStep, label=from_input("second_label"))


class ApprovalStep(Step):
    inputs = ("approval",)

    def run(self, args: dict[str, Any], context: Any) -> Any:
        timed("apply", context, 0.01)
        return Success({"applied": args["approval"]})


@with_lock(lambda inputs: f"order:{inputs['order_id']}", ttl=30)
class ApprovalReactor(Reactor):
    inputs = ("order_id",)

    prepare = step(PrepareStep, account_id=from_input("order_id"))
    approval = interrupt(correlation_id=lambda inputs: f"order:{inputs['order_id']}")
    apply = step(ApprovalStep, approval=from_result("approval"))

    returns = "apply"


class BackgroundApprovalReactor(Reactor):
    inputs = ("order_id",)
    background = True

    prepare = step(PrepareStep, account_id=from_input("order_id"))
    approval = interrupt(correlation_id=lambda inputs: f"bg-order:{inputs['order_id']}")
    apply = step(ApprovalStep, approval=from_result("approval"))

    returns = "apply"


class TimedApprovalReactor(Reactor):
    inputs = ("order_id",)

    prepare = step(AuditStep, account_id=from_input("order_id"))
    approval = interrupt(timeout=1)
    apply = step(ApprovalStep, approval=from_result("approval"))


@with_lock(lambda inputs: f"child:{inputs['key']}", ttl=30)
class LockedChild(Reactor):
    """Composed into ``LockedParent``: its own reactor-level lock, a completed step to undo,
    then a step that parks the tree on ``side:<side>``."""

    inputs = ("key", "side")

    audit = step(AuditStep, account_id=from_input("key"))
    side = step(SideLockedStep, key=from_input("key"), side=from_input("side"))


@with_lock(lambda inputs: f"parent:{inputs['key']}", ttl=30)
class LockedParent(Reactor):
    inputs = ("key", "side")

    sub = compose(LockedChild, key=from_input("key"), side=from_input("side"))
