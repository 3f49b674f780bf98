"""The held-key registry in Redis: what one owner may hold, written ahead of every admission.

A worker delivery can be killed at any instruction. Its holds are owned by the execution tree's
root id, so the redelivery must free exactly what the dead one held — including holds taken
inside a composed child, a ``map_step`` over a reactor, or a compensate/undo interrupted by the
crash, none of which can be recomputed from the execution's checkpoint. So a worker announces
each lock and semaphore key in a Redis hash named after the owner (``{prefix}:held:{<owner>}``,
field ``primitive:key``, value the step that asked, "" at reactor level) *before* asking for it,
and removes it once the key is fully given back:

* a crash between the announcement and the admission leaves an entry for a key the owner does
  not hold — dropping it later is a no-op (force-release checks the owner);
* a crash while holding leaves the entry, so the redelivery (``engine.worker.drop_stale_holds``)
  force-releases it;
* a hold kept across a park stays announced until the execution lets it go.

Only worker deliveries keep a registry: an in-process run has no redelivery, and ``Step.call``
pays nothing. One hash per owner lives in its own hash slot; it is never part of an admission
script, so Redis Cluster needs nothing special. The hash expires a day after its last change, as
a bound on garbage if an execution is abandoned for good.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from reactor_app.coordination.keys import key
from reactor_app.coordination.redis import get_client, unavailable_on_connection_error

logger = logging.getLogger(__name__)

#: seconds a registry outlives its last change
REGISTRY_TTL = 86400


def _entry(primitive: str, user_key: str) -> str:
    return f"{primitive}:{user_key}"


def _parse(entry: str) -> tuple[str, str]:
    primitive, _, user_key = entry.partition(":")
    return primitive, user_key


class HoldRegistry:
    """The announced lock/semaphore keys of one owner (see the module docstring)."""

    def __init__(self, owner: str, client: Any = None) -> None:
        self.owner = owner
        self._client = client

    @property
    def client(self) -> Any:
        return self._client or get_client()

    @property
    def name(self) -> str:
        return key("held", self.owner)

    def announce(self, pairs: Iterable[tuple[str, str]], step: str | None = None) -> None:
        """Record ``(primitive, key)`` pairs, asked for by ``step``, before they are asked for.
        Raises ``CoordinationUnavailable`` when Redis is down (the admission would fail)."""
        entries = {_entry(p, k): step or "" for p, k in pairs}
        if not entries:
            return
        with unavailable_on_connection_error(primitive="registry"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(self.name, mapping=entries)
            pipe.expire(self.name, REGISTRY_TTL)
            pipe.execute()

    def withdraw(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Forget pairs fully given back (or never obtained). Best effort: a leftover entry
        only costs the next takeover a no-op force-release."""
        entries = [_entry(p, k) for p, k in pairs]
        if not entries:
            return
        try:
            self.client.hdel(self.name, *entries)
        except SoftTimeLimitExceeded:
            raise  # the task's time limit stops the delivery here (docs/operations.md)
        except Exception:
            logger.warning("could not withdraw %s from %s", entries, self.name, exc_info=True)

    def entries(self) -> list[tuple[str, str, str | None]]:
        """Every announced ``(primitive, key, step)``, sorted for a stable order."""
        with unavailable_on_connection_error(primitive="registry"):
            found = self.client.hgetall(self.name)
        entries = []
        for field, step in found.items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            label = step.decode() if isinstance(step, bytes) else str(step)
            primitive, user_key = _parse(name)
            entries.append((primitive, user_key, label or None))
        return sorted(entries, key=lambda e: (e[0], e[1]))

    def clear(self) -> None:
        with unavailable_on_connection_error(primitive="registry"):
            self.client.delete(self.name)
