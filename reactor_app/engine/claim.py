"""The execution claim: one delivery at a time runs one execution (docs/design.md).

A delivery first takes the **execution claim** — a Redis lock on the execution id owned by this
delivery, with a TTL renewed from a daemon thread while it runs — so two deliveries never run
one execution at once. Renewal that finds the claim gone marks it lost; the engine checks that
at every checkpoint (``ExecutionClaim.check`` raises ``ClaimLost``) and stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from redis.exceptions import LockError

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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, wait: float = 0.0) -> bool:
        with unavailable_on_connection_error(key=self.name, primitive="claim"):
            return bool(
                self._lock.acquire(
                    blocking=wait > 0, blocking_timeout=wait or None, token=self.owner
                )
            )

    def start_renewal(self) -> None:
        self._thread = threading.Thread(
            target=self._renew, name=f"reactor-claim-{self.name}", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self._lock.reacquire()
            except LockError:
                self.lost = True
                logger.error("the claim %s was lost; another delivery may run it", self.name)
                return
            except Exception:  # Redis briefly unreachable: keep trying until the TTL decides
                logger.warning("could not renew the claim %s", self.name, exc_info=True)

    def check(self) -> None:
        """Raise ``ClaimLost`` if renewal found the claim gone (called at every checkpoint)."""
        if self.lost:
            raise ClaimLost(f"the claim {self.name} lapsed; stopping this delivery")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._lock.release()
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


def delivery_owner(task_id: str | None) -> str:
    """The claim owner of one delivery: where it runs, which task, and a fresh nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{task_id or '-'}:{uuid.uuid4().hex[:8]}"
