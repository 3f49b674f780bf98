"""Claims: what one unit of work (a reactor run or a step execution) asks coordination for.

A claim is a declaration whose key has been computed; the coordination layer only ever sees
claims, never key functions. The outcome types below are what admission answers with.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

Primitive = Literal["lock", "semaphore", "rate_limit", "period", "ordered_lock"]

#: the fixed admission order of docs/design.md §2.1 (release runs in reverse)
ADMISSION_ORDER: tuple[Primitive, ...] = (
    "ordered_lock",
    "period",
    "lock",
    "semaphore",
    "rate_limit",
)


@dataclass(frozen=True)
class Holder:
    """Who takes a hold: the owner (root execution id, or a per-call id) and attribution."""

    owner: str
    execution_id: str | None = None
    step: str | None = None  # None for a reactor-level hold
    reactor: str | None = None
    #: the waiter's priority in a line of waiters (``run_async(priority=...)``): higher is
    #: admitted first, within the bound ``lua/_common.lua`` (``waiter_score``) documents
    priority: int = 0


@dataclass(frozen=True)
class LockClaim:
    key: str
    ttl: float = 60.0  # seconds
    auto_extend: bool = True
    primitive: Primitive = field(default="lock", init=False)


@dataclass(frozen=True)
class SemaphoreClaim:
    key: str
    #: for a named limit, its value when the claim was made (each admission reads it again:
    #: ``semaphore.live_claim``)
    limit: int
    ttl: float = 60.0  # lease seconds
    #: a named limit of ``REACTOR_LIMITS`` (``with_semaphore(key, limit="name")``), which an
    #: operator can override live (``coordination.live_limits``); None: ``limit`` as declared
    limit_name: str | None = None
    #: the waiter's ``fair_by`` group: the line is served round-robin across groups
    fair: str | None = None
    primitive: Primitive = field(default="semaphore", init=False)


@dataclass(frozen=True)
class RateWindow:
    seconds: float
    limit: int
    label: str  # "second", "minute", "hour", "day" or the seconds as text


@dataclass(frozen=True)
class RateLimitClaim:
    key: str
    windows: tuple[RateWindow, ...]
    strategy: Literal["sliding", "fixed"] = "sliding"
    #: units this admission charges against every window (weighted limits; 1 = one admission)
    cost: int = 1
    #: a named limit of ``REACTOR_RATE_LIMITS`` (its windows are read again at each admission:
    #: ``rate_limit.live_claim``); None: ``windows`` as declared
    limit_name: str | None = None
    primitive: Primitive = field(default="rate_limit", init=False)


@dataclass(frozen=True)
class PeriodClaim:
    key: str
    every: str | int  # "second" ... "year" (calendar UTC) or seconds (epoch-aligned)
    ttl: float = 60.0  # lease seconds of the in-flight reservation (renewed while it runs)
    primitive: Primitive = field(default="period", init=False)


@dataclass(frozen=True)
class OrderedPosition:
    nonce: int
    epoch: int


#: the position of an ordered-lock claim that has none yet (a direct ``Step.call``): the
#: admission assigns it in its own round trip and answers it (``assigned`` of the result)
UNASSIGNED = OrderedPosition(nonce=0, epoch=0)


@dataclass(frozen=True)
class OrderedLockClaim:
    key: str
    position: OrderedPosition
    ttl: float = 86400.0
    poison_pill_timeout: float = 600.0
    strict: bool = True
    primitive: Primitive = field(default="ordered_lock", init=False)


Claim = LockClaim | SemaphoreClaim | RateLimitClaim | PeriodClaim | OrderedLockClaim


@dataclass
class Hold:
    """One primitive that was admitted."""

    claim: Claim
    fresh: bool  # False when the owner re-entered a hold it already had
    token: int | None = None  # fencing token (locks only): never below Redis TIME in µs
    #: the acquisition a semaphore slot was taken under (its Redis time in µs, as text): the
    #: release and renewal of this hold touch only that one, never a slot the same owner took
    #: again after this one was force-released (None: not known, not checked)
    lease: str | None = None


@dataclass
class Admitted:
    holds: list[Hold]
    holder: Holder
    #: monotonic time the admission was sent (0: unknown). The leases were granted after it,
    #: so a lease clock started here never outlives the lease in Redis (``renewal``).
    sent_at: float = 0.0
    #: ordered positions this admission assigned (user key -> position; see ``UNASSIGNED``)
    assigned: dict[str, OrderedPosition] = field(default_factory=dict)
    #: waiters this admission granted a semaphore's free slots to (a limit raised live: the
    #: line is served first, ``lua/_semaphore.lua``): parked ones must be re-enqueued
    woken: list[str] = field(default_factory=list)

    def token_for(self, key: str | None = None) -> int | None:
        for hold in self.holds:
            if hold.token is not None and (key is None or hold.claim.key == key):
                return hold.token
        return None


@dataclass(frozen=True)
class RefusalDetail:
    """What a refusal says beyond its hint and blocker: the admission script's status code and
    Redis time, and the fields of the refusing primitive (``None`` where they do not apply)."""

    status: int  # ``coordination.scripts.Status`` of the refusal
    time: str = ""  # Redis TIME of the decision, "seconds.micros"
    #: an ordered position from before a reset, or already passed over: re-assign it
    stale: bool = False
    limit: int | None = None  # semaphore slots, or the full rate-limit window's limit
    held: int | None = None  # semaphore slots taken
    label: str | None = None  # rate limit: the full window's label ("second", "3600s"...)
    window: float | None = None  # rate limit: that window's length in seconds
    count: int | None = None  # rate limit: units charged in that window
    cost: int | None = None  # rate limit: units this admission would charge
    bucket: int | None = None  # period in flight: the bucket's start (epoch seconds)
    bucket_end: int | None = None
    nonce: int | None = None  # ordered lock: this position
    epoch: int | None = None
    head: int | None = None  # ordered lock: the position it waits for
    last_completed: int | None = None
    reason: str | None = None  # ordered lock, stale: "epoch" or "passed"


#: waiter ids of callers waiting in-process (a synchronous wait; a worker delivery before it
#: parks): woken by a release's PUBLISH, never re-enqueued like a parked execution
WAITING_PREFIX = "wait:"


@dataclass
class Refused:
    """Contention: nothing was taken. ``retry_after`` is the primitive's own hint in seconds."""

    claim: Claim
    detail: RefusalDetail
    retry_after: float | None = None
    blocker: dict[str, Any] | None = None  # holder snapshot: owner, step, execution, since, ttl
    #: waiters a wait that gave up handed its keys on to (``Coordinator.admit_waiting``), or
    #: that the refused admission granted a semaphore's free slots to (the line first):
    #: parked ones must be re-enqueued like any woken waiter
    woken: list[str] = field(default_factory=list)
    #: ordered positions the refused admission assigned all the same (``UNASSIGNED``): the
    #: caller's place in the line, for its next attempt or for leaving the line
    assigned: dict[str, OrderedPosition] = field(default_factory=dict)


@dataclass
class PeriodHit:
    """The dedup bucket is already marked: the work must be skipped (step) or halted (reactor)."""

    claim: PeriodClaim
    marked_by: str | None = None
    #: parked waiters of the next ordered position, which this skip let through
    woken: list[str] = field(default_factory=list)
    #: ordered positions this admission assigned (``UNASSIGNED``)
    assigned: dict[str, OrderedPosition] = field(default_factory=dict)


@dataclass
class ChainFailed:
    """Strict ordered lock: an earlier position failed, so this one is skipped."""

    claim: OrderedLockClaim
    first_failed: int | None = None
    #: parked waiters of the next position, which this skip let through
    woken: list[str] = field(default_factory=list)
    #: ordered positions this admission assigned (``UNASSIGNED``)
    assigned: dict[str, OrderedPosition] = field(default_factory=dict)


AdmissionResult = Admitted | Refused | PeriodHit | ChainFailed


def with_positions(claims: list[Claim], assigned: dict[str, OrderedPosition]) -> list[Claim]:
    """``claims`` with each ``UNASSIGNED`` ordered-lock claim given its position from
    ``assigned`` (an admission's answer), so later attempts and the release use that place."""
    if not assigned:
        return claims
    return [
        replace(claim, position=assigned[claim.key])
        if isinstance(claim, OrderedLockClaim)
        and claim.position == UNASSIGNED
        and claim.key in assigned
        else claim
        for claim in claims
    ]


Outcome = Literal["success", "failure", "halt", "retry", "park", "rollback"]
