"""The execution claim: one delivery at a time runs one execution (docs/design.md).

A delivery first takes the **execution claim** — a Redis lock on the execution id owned by this
delivery, with a TTL renewed while it runs — so two deliveries never run one execution at once.
Renewal that finds the claim gone marks it lost; the engine checks that at every checkpoint
(``ExecutionClaim.check`` raises ``ClaimLost``) and stops. The renewals are one daemon thread's
per process (``ClaimRenewer``), not a thread per delivery: a thread started for each delivery
waited for the OS to schedule it before the delivery could go on.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from redis.exceptions import LockError

from reactor_app import forks
from reactor_app.background import BackgroundThread
from reactor_app.conf import reactor_settings
from reactor_app.coordination.keys import key as redis_key
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error
from reactor_app.engine.worker import ClaimLost

logger = logging.getLogger(__name__)

#: seconds a delivery waits for a claim held by another delivery before giving up; covers a
#: wake that arrives while the parking delivery is still letting go of its claim
CLAIM_WAIT = 2.0


def claim_ttl() -> float:
    """``REACTOR_EXECUTION_CLAIM_TTL``: seconds a silent delivery keeps its claim (default 30)."""
    return reactor_settings.EXECUTION_CLAIM_TTL


class ExecutionClaim:
    """A Redis lock on one execution id, owned by one delivery, renewed while it runs."""

    def __init__(
        self, execution_id: Any, owner: str, *, ttl: float | None = None, client: Any = None
    ) -> None:
        self.client = client or get_client()
        self.name = redis_key("claim", str(execution_id))
        self.ttl = ttl if ttl is not None else claim_ttl()
        self.owner = owner
        self.lost = False
        self._lock = self.client.lock(self.name, timeout=self.ttl, thread_local=False)
        self._renewing = False

    def acquire(self, wait: float = 0.0, *, read_with: tuple[str, ...] = ()) -> bool:
        """Take the claim, waiting up to ``wait`` seconds for another delivery's to go.
        ``read_with``: keys read in the same round trip as the first attempt (a pipeline: one
        round trip, not a transaction), their values left in ``self.read`` — the delivery
        reads its cancel flag so (``engine.cancel_flag.note_read``). A claim taken elsewhere
        waits as before, and leaves ``read`` None."""
        self.read: list[Any] | None = None
        with unavailable_on_connection_error(key=self.name, primitive="claim"):
            if read_with:
                token = self.client.get_encoder().encode(self.owner)
                pipe = self.client.pipeline(transaction=False)
                # what redis-py's Lock.acquire sends (SET NX PX with the owner's token)
                pipe.set(self.name, token, nx=True, px=int(self.ttl * 1000))
                for name in read_with:
                    pipe.get(name)
                taken, *values = pipe.execute()
                if taken:
                    self._lock.local.token = token  # the Lock's own record of its token
                    self.read = values
                    return True
            return bool(
                self._lock.acquire(
                    blocking=wait > 0, blocking_timeout=wait or None, token=self.owner
                )
            )

    def start_renewal(self) -> None:
        """Renew the claim every third of its TTL until ``release``: by the process's one
        claim renewer (``_renewer``), not a thread of this delivery's own — starting a thread
        waits for the OS to schedule it, which on a loaded machine added milliseconds to every
        delivery before its body (docs/benchmarks.md, "Wake latency")."""
        self._renewing = True
        _renewer().add(self)

    def renew(self) -> bool:
        """One renewal (the renewer's thread); False when the claim is lost or released."""
        try:
            self._lock.reacquire()
        except LockError:
            if self._renewing:
                self.lost = True
                logger.error("the claim %s was lost; another delivery may run it", self.name)
            return False
        except Exception:  # Redis briefly unreachable: keep trying until the TTL decides
            logger.warning("could not renew the claim %s", self.name, exc_info=True)
        return True

    def check(self) -> None:
        """Raise ``ClaimLost`` if renewal found the claim gone (called at every checkpoint)."""
        if self.lost:
            raise ClaimLost(f"the claim {self.name} lapsed; stopping this delivery")

    def release(self) -> None:
        if self._renewing:
            self._renewing = False
            _renewer().remove(self)  # and waits for a renewal of it in flight
        try:
            self._lock.release()
        except SoftTimeLimitExceeded:
            # the task's time limit, not a failed release: it ends the delivery here as on
            # any other line (docs/operations.md, "Celery time limits"); the TTL frees it
            raise
        except Exception:  # lapsed or Redis unreachable: the TTL frees it either way
            logger.debug("claim %s was not released by its owner", self.name, exc_info=True)

    def ttl_left(self) -> float:
        with unavailable_on_connection_error(key=self.name, primitive="claim"):
            ms = self.client.pttl(self.name)
        return max(float(ms), 0.0) / 1000 if ms and ms > 0 else 0.0

    @classmethod
    def is_held(cls, execution_id: Any, client: Any = None) -> bool:
        client = client or get_client()
        with unavailable_on_connection_error(primitive="claim"):
            return bool(client.exists(redis_key("claim", str(execution_id))))


class ClaimRenewer:
    """One daemon thread per process renewing every claim its deliveries hold, each every
    third of its TTL (a claim renewed late by a busy process still has two thirds left)."""

    def __init__(self) -> None:
        self.pid = forks.pid()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._part_done = threading.Condition(self._lock)
        #: id() of each registered claim -> [monotonic due time, claim]
        self._due: dict[int, list[Any]] = {}
        #: id() of the claim the thread is renewing right now, if any
        self._in_flight: int | None = None
        self._background = BackgroundThread(self._run, "reactor-claim-renewal")
        #: the monotonic time the thread sleeps until (0: awake)
        self._sleeping_until = 0.0
        #: the TTL of the claim added last: the thread's idle sleep is a third of it. Taken
        #: from the claims, not read from the settings in the thread: a settings read that
        #: raised there (a test overriding the setting with a value it refuses) ended the
        #: thread, and with it every renewal of the process
        self._usual_ttl = 30.0

    def add(self, claim: ExecutionClaim) -> None:
        with self._lock:
            self._due[id(claim)] = [time.monotonic() + claim.ttl / 3, claim]
            self._usual_ttl = claim.ttl
            if not self._background.ensure() and self._due[id(claim)][0] < self._sleeping_until:
                # Only then: the thread sleeps at most a third of a TTL even with nothing to
                # renew, so a claim of the usual TTL is never due before it wakes — waking it
                # for every delivery would cost each one a context switch.
                self._changed.notify()

    def remove(self, claim: ExecutionClaim, timeout: float = 5.0) -> None:
        """Stop renewing ``claim``; while the thread is renewing it right now, wait for that
        renewal, so none runs for it after its release."""
        with self._lock:
            self._due.pop(id(claim), None)
            deadline = time.monotonic() + timeout
            while self._in_flight == id(claim) and not self._background.is_current():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._part_done.wait(timeout=left)

    def active(self) -> int:
        with self._lock:
            return len(self._due)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                due = [entry for entry in self._due.values() if entry[0] <= now]
                if not due:
                    idle = now + self._usual_ttl / 3
                    self._sleeping_until = min([idle, *(e[0] for e in self._due.values())])
                    self._changed.wait(timeout=self._sleeping_until - now)
                    self._sleeping_until = 0.0
                    continue
            for entry in due:
                claim: ExecutionClaim = entry[1]
                with self._lock:
                    if self._due.get(id(claim)) is not entry:
                        continue  # released meanwhile
                    self._in_flight = id(claim)
                try:
                    kept = claim.renew()
                finally:
                    with self._lock:
                        self._in_flight = None
                        self._part_done.notify_all()
                        if self._due.get(id(claim)) is entry:
                            if kept:
                                entry[0] = time.monotonic() + claim.ttl / 3
                            else:
                                del self._due[id(claim)]


_the_renewer: ClaimRenewer | None = None
_renewer_guard = threading.Lock()


def _renewer() -> ClaimRenewer:
    """This process's claim renewer (a forked child starts its own: threads do not survive a
    fork)."""
    global _the_renewer
    with _renewer_guard:
        if _the_renewer is None or _the_renewer.pid != forks.pid():
            _the_renewer = ClaimRenewer()
        return _the_renewer


def delivery_owner(task_id: str | None) -> str:
    """The claim owner of one delivery: where it runs, which task, and a fresh nonce."""
    # the system's own id, asked once per delivery: an identity an operator reads, not a check
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or '-'}:{uuid.uuid4().hex[:8]}"
