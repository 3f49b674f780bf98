"""Clients of the five primitives that record their operations, and broken ones to prove the
checker finds what they break.

Every client has the same verbs — ``acquire(key, session)`` answering ``(admitted, values)``
and ``release(key, session, hold)`` answering whether the store freed the hold — so one
workload (``workloads``) drives ours and a broken one alike:

* ``CoordinatorLock`` / ``CoordinatorSemaphore`` / ``CoordinatorRateLimit`` /
  ``CoordinatorPeriod`` / ``CoordinatorOrderedLock`` — ``Coordinator.admit`` / ``release``,
  the library's own admission scripts;
* ``UncheckedReleaseLock`` — ``SET NX PX`` to take, a bare ``DEL`` to release: no owner check,
  so a holder whose lease lapsed deletes its successor's hold;
* ``ResettingFenceLock`` — tokens from a per-key ``INCR`` counter that lives with the key
  space: a Redis restarted empty starts it again at 1;
* ``OverAdmittingSemaphore`` — ``GET`` the count, then ``INCR`` (check-then-act, not atomic);
* ``ForgetfulRateLimit`` — a sliding window that purges admissions after half the window;
* ``CheckThenSetPeriod`` — ``GET`` the mark, run, ``SET`` the mark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import (
    UNASSIGNED,
    Admitted,
    Holder,
    LockClaim,
    OrderedLockClaim,
    PeriodClaim,
    PeriodHit,
    RateLimitClaim,
    RateWindow,
    Refused,
    SemaphoreClaim,
)
from reactor_app.coordination.period import bucket_bounds

Values = dict[str, Any]


@dataclass
class CoordinatorLock:
    ttl: float = 30.0
    coordinator: Coordinator = field(default_factory=Coordinator)
    primitive: str = "lock"

    def claim(self, key: str) -> Any:
        return LockClaim(key, ttl=self.ttl, auto_extend=False)

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        result = self.coordinator.admit([self.claim(key)], Holder(owner=session))
        if not isinstance(result, Admitted):
            return False, {}, None
        return True, self.seen(result, key), result

    def seen(self, admitted: Admitted, key: str) -> Values:
        return {"token": admitted.token_for(key)}

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        released = self.coordinator.release(hold, outcome)  # type: ignore[arg-type]
        return {"released": bool(released.freed) or bool(released.marked)}

    def expected(self) -> Values:
        return {"ttl": self.ttl}


@dataclass
class CoordinatorSemaphore(CoordinatorLock):
    limit: int = 2
    primitive: str = "semaphore"

    def claim(self, key: str) -> Any:
        return SemaphoreClaim(key, limit=self.limit, ttl=self.ttl)

    def seen(self, admitted: Admitted, key: str) -> Values:
        return {}

    def expected(self) -> Values:
        return {"ttl": self.ttl, "limit": self.limit}


@dataclass
class CoordinatorRateLimit(CoordinatorLock):
    window: float = 1.0
    limit: int = 3
    cost: int = 1
    primitive: str = "rate_limit"

    def claim(self, key: str) -> Any:
        window = RateWindow(self.window, self.limit, f"{self.window:g}")
        return RateLimitClaim(key, windows=(window,), cost=self.cost)

    def seen(self, admitted: Admitted, key: str) -> Values:
        return {}

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        self.coordinator.release(hold, outcome)  # type: ignore[arg-type]
        return {}

    def expected(self) -> Values:
        return {"window": self.window, "limit": self.limit, "cost": self.cost}


@dataclass
class CoordinatorPeriod(CoordinatorLock):
    #: epoch-aligned seconds: long, so a run stays in one bucket (the bucket is in the key)
    every: int = 1_000_000
    primitive: str = "period"

    def claim(self, key: str) -> Any:
        return PeriodClaim(key, every=self.every, ttl=self.ttl)

    def bucket(self, key: str) -> str:
        return f"{key}@{bucket_bounds(self.every, time.time())[0]}"

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        result = self.coordinator.admit([self.claim(key)], Holder(owner=session))
        if isinstance(result, PeriodHit):
            return False, {"hit": True}, None
        if not isinstance(result, Admitted):
            return False, {}, None
        return True, {}, result

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        released = self.coordinator.release(hold, outcome)  # type: ignore[arg-type]
        return {"marked": bool(released.marked)}


@dataclass
class CoordinatorOrderedLock(CoordinatorLock):
    #: seconds a silent holder keeps the line before it is passed over
    poison_pill: float = 5.0
    #: seconds a caller waits for its turn before it gives up (a refusal)
    wait: float = 10.0
    primitive: str = "ordered_lock"

    def claim(self, key: str, position: Any = UNASSIGNED) -> Any:
        return OrderedLockClaim(
            key, position=position, ttl=self.ttl, poison_pill_timeout=self.poison_pill
        )

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        # an ordered lock is a line: a caller keeps its place until its turn
        holder = Holder(owner=session)
        claim = self.claim(key)
        deadline = time.monotonic() + self.wait
        while True:
            result = self.coordinator.admit([claim], holder)
            if isinstance(result, Admitted):
                position = result.assigned.get(key) or claim.position
                return True, {"position": [position.epoch, position.nonce]}, result
            assigned = getattr(result, "assigned", {}).get(key)
            if assigned is not None:
                claim = self.claim(key, assigned)
            elif isinstance(result, Refused) and result.detail.stale:
                claim = self.claim(key)  # its place is gone (a line lost or reset): a new one
            if time.monotonic() > deadline:
                return False, {}, None
            time.sleep(0.005)

    def expected(self) -> Values:
        # a holder silent for the poison pill is passed over: that is its lease
        return {"ttl": min(self.ttl, self.poison_pill)}


# -- broken clients ---------------------------------------------------------------------------


@dataclass
class RawClient:
    """A broken client's store: the test's Redis, its keys under the test's prefix."""

    redis: Any
    prefix: str
    ttl: float = 30.0

    def name(self, *parts: str) -> str:
        return ":".join([self.prefix, "broken", *parts])

    def expected(self) -> Values:
        return {"ttl": self.ttl}


@dataclass
class UncheckedReleaseLock(RawClient):
    primitive: str = "lock"

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        if not self.redis.set(self.name(key), session, nx=True, px=int(self.ttl * 1000)):
            return False, {}, None
        return True, {"token": int(self.redis.incr(self.name(key, "fence")))}, session

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        return {"released": bool(self.redis.delete(self.name(key)))}  # whoever holds it


@dataclass
class ResettingFenceLock(RawClient):
    """Owner-checked, but its fencing counter is lost with the key space."""

    primitive: str = "lock"

    RELEASE = (
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
        "return 0"
    )

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        if not self.redis.set(self.name(key), session, nx=True, px=int(self.ttl * 1000)):
            return False, {}, None
        return True, {"token": int(self.redis.incr(self.name(key, "fence")))}, session

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        return {"released": bool(self.redis.eval(self.RELEASE, 1, self.name(key), session))}


@dataclass
class OverAdmittingSemaphore(RawClient):
    limit: int = 2
    primitive: str = "semaphore"

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        count = int(self.redis.get(self.name(key)) or 0)
        if count >= self.limit:
            return False, {}, None
        time.sleep(0.002)  # the gap between the check and the act
        self.redis.incr(self.name(key))
        return True, {}, session

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        self.redis.decr(self.name(key))
        return {"released": True}

    def expected(self) -> Values:
        return {"ttl": self.ttl, "limit": self.limit}


@dataclass
class ForgetfulRateLimit(RawClient):
    window: float = 1.0
    limit: int = 3
    cost: int = 1
    primitive: str = "rate_limit"

    ADMIT = (
        "local now = redis.call('TIME') "
        "local t = tonumber(now[1]) * 1000000 + tonumber(now[2]) "
        # the bug: admissions are forgotten after half the window
        "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t - tonumber(ARGV[1]) / 2) "
        "if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end "
        "redis.call('ZADD', KEYS[1], t, ARGV[3]) return 1"
    )

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        admitted = self.redis.eval(
            self.ADMIT, 1, self.name(key), int(self.window * 1e6), self.limit, session
        )
        return bool(admitted), {}, session

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        return {}

    def expected(self) -> Values:
        return {"window": self.window, "limit": self.limit, "cost": self.cost}


@dataclass
class CheckThenSetPeriod(RawClient):
    every: int = 1_000_000
    primitive: str = "period"

    def bucket(self, key: str) -> str:
        return f"{key}@{bucket_bounds(self.every, time.time())[0]}"

    def acquire(self, key: str, session: str) -> tuple[bool, Values, Any]:
        if self.redis.get(self.name(self.bucket(key))):
            return False, {"hit": True}, None
        return True, {}, session

    def release(self, key: str, session: str, hold: Any, outcome: str = "success") -> Values:
        if outcome != "success":
            return {"marked": False}
        self.redis.set(self.name(self.bucket(key)), session)
        return {"marked": True}
