"""Refusals as exceptions: the public error of §1.3 for a contention refusal, and
``LeaseLost`` for a hold whose renewal failed.

Contention is answered, not raised, by ``Coordinator.admit``: ``Refused`` (with the
primitive's ``retry_after`` hint and a blocker snapshot), ``PeriodHit`` or ``ChainFailed``.
``refusal_error`` turns a ``Refused`` into the exception the caller raises, naming reactor, step
and key; the ``STATUSES`` table says which exception a status code maps to.
"""

from __future__ import annotations

from typing import Any

from reactor_app.coordination.claims import Hold, Holder, Refused
from reactor_app.coordination.scripts import STATUSES, Status
from reactor_app.exceptions import (
    CoordinationError,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    PeriodInFlightError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
)


def _where(reactor: str | None, step: str | None) -> str:
    parts = []
    if reactor:
        parts.append(f"reactor {reactor}")
    if step:
        parts.append(f"step {step!r}")
    return ", ".join(parts) or "direct call"


def _who(blocker: dict[str, Any] | None) -> str:
    if not blocker:
        return "another execution"
    if blocker.get("granted_to"):
        # free, but handed to the head of the key's line by the last release
        return f"nobody: it is handed to waiter {blocker['granted_to']}, ahead in its line"
    text = f"owner {blocker.get('owner')}"
    if blocker.get("step"):
        text += f" (step {blocker['step']!r}"
        text += f" of {blocker['reactor']})" if blocker.get("reactor") else ")"
    elif blocker.get("reactor"):
        text += f" ({blocker['reactor']})"
    return text


def _after(retry_after: float | None) -> str:
    return f"; retry after {retry_after:.3f}s" if retry_after is not None else ""


def refusal_error(
    refused: Refused, reactor: str | None = None, step: str | None = None
) -> CoordinationError:
    """The public error for a contention refusal, naming reactor, step and key (§1.3)."""
    claim = refused.claim
    status = Status(refused.detail.status)
    error_class = STATUSES[status].error
    where = _where(reactor, step)
    common: dict[str, Any] = {
        "reactor": reactor,
        "step": step,
        "key": claim.key,
        "primitive": claim.primitive,
    }
    if error_class is LockAcquisitionError:
        return LockAcquisitionError(
            f"{where}: lock {claim.key!r} is held by {_who(refused.blocker)}"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            holder=refused.blocker,
            **common,
        )
    if error_class is SemaphoreAcquisitionError:
        limit = refused.detail.limit or getattr(claim, "limit", None)
        taken = f"all {limit} slots of semaphore {claim.key!r} are taken"
        granted = (refused.blocker or {}).get("granted_to")
        if granted:
            # a slot is free, but a release handed it to the head of the key's line
            taken = (
                f"the free slot of semaphore {claim.key!r} is handed to waiter {granted}, "
                "ahead in its line"
            )
        return SemaphoreAcquisitionError(
            f"{where}: {taken}" + _after(refused.retry_after),
            retry_after=refused.retry_after,
            limit=limit,
            **common,
        )
    if error_class is PeriodInFlightError:
        bucket = refused.detail.bucket
        return PeriodInFlightError(
            f"{where}: period {claim.key!r} (bucket starting {bucket}) is being run by "
            f"{_who(refused.blocker)}; it will be done or free when that run ends"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            holder=refused.blocker,
            bucket=bucket,
            **common,
        )
    if error_class is RateLimitExceeded:
        limit = refused.detail.limit
        label = refused.detail.label
        cost = refused.detail.cost or getattr(claim, "cost", 1)
        charged = f" (this admission costs {cost})" if cost != 1 else ""
        return RateLimitExceeded(
            f"{where}: rate limit {claim.key!r} allows {limit} per {label}{charged}"
            + _after(refused.retry_after),
            retry_after=refused.retry_after,
            limit=limit,
            period=label,
            **common,
        )
    nonce = refused.detail.nonce
    last_completed = refused.detail.last_completed
    if refused.detail.stale:
        text = f"{where}: ordered lock {claim.key!r}: position {nonce} is stale (reset or passed)"
    else:
        text = (
            f"{where}: ordered lock {claim.key!r}: position {nonce} waits for position "
            f"{refused.detail.head} (last completed {last_completed})"
        )
    return OrderedLockWaitError(
        text + _after(refused.retry_after),
        nonce=nonce,
        last_completed=last_completed,
        retry_after=refused.retry_after,
        **common,
    )


def lease_lost(hold: Hold, holder: Holder, reason: str) -> LeaseLost:
    """The ``LeaseLost`` error for a hold whose renewal failed."""
    return LeaseLost(
        f"{_where(holder.reactor, holder.step)}: the {hold.claim.primitive} on "
        f"{hold.claim.key!r} was lost ({reason}); it may now belong to someone else",
        reactor=holder.reactor,
        step=holder.step,
        key=hold.claim.key,
        primitive=hold.claim.primitive,
        token=hold.token,
        reason=reason,
    )
