"""Read-only snapshots of coordination state, for operators (admin, API) and tests.

Each primitive module owns its reader; this module gathers them under one roof and adds
``live_holds()``, which lists every lock and semaphore hold under the key prefix with its
attribution (owner, step, execution, reactor), so the admin can show who holds what without a
database join. Nothing here writes to Redis.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from reactor_app.coordination import lock, ordered_lock, period, rate_limit, semaphore
from reactor_app.coordination.keys import current_prefix, glob_escape, split_key
from reactor_app.coordination.lock import LockState
from reactor_app.coordination.ordered_lock import OrderedLockState
from reactor_app.coordination.redis import (
    get_client,
    is_cluster,
    server_time,
    unavailable_on_connection_error,
)
from reactor_app.coordination.semaphore import SemaphoreState

__all__ = [
    "LockState",
    "OrderedLockState",
    "SemaphoreState",
    "live_holds",
    "lock_state",
    "ordered_state",
    "period_marked",
    "period_reserved",
    "rate_limit_count",
    "semaphore_state",
]


def lock_state(key: str, *, client: Any = None, prefix: str | None = None) -> LockState:
    return lock.lock_state(key, client=client, prefix=prefix)


def semaphore_state(
    key: str, limit: int | None = None, *, client: Any = None, prefix: str | None = None
) -> SemaphoreState:
    return semaphore.semaphore_state(key, limit, client=client, prefix=prefix)


def rate_limit_count(
    key: str,
    window: str | float | timedelta,
    *,
    strategy: str = "sliding",
    client: Any = None,
    prefix: str | None = None,
) -> int:
    """Admissions counted now in the window of that length (``"minute"`` or seconds)."""
    return rate_limit.rate_limit_count(key, window, strategy=strategy, client=client, prefix=prefix)


def period_marked(
    key: str, every: str | int, *, client: Any = None, prefix: str | None = None
) -> str | None:
    """The execution (else owner) that marked the current bucket, or None."""
    return period.period_marked(key, every, client=client, prefix=prefix)


def period_reserved(
    key: str, every: str | int, *, client: Any = None, prefix: str | None = None
) -> dict[str, Any] | None:
    """The live in-flight reservation of the current bucket (owner, count, step, execution,
    reactor, acquired_at ms, ttl s), or None."""
    return period.period_reserved(key, every, client=client, prefix=prefix)


def ordered_state(key: str, *, client: Any = None, prefix: str | None = None) -> OrderedLockState:
    return ordered_lock.ordered_state(key, client=client, prefix=prefix)


def live_holds(*, client: Any = None, prefix: str | None = None) -> list[dict[str, Any]]:
    """Every live lock and semaphore hold under the prefix, one dict per holder:
    ``primitive, key, owner, step, execution, reactor, acquired_at (epoch s), ttl_left (s),
    count, token``. Sorted by primitive, key, then acquisition."""
    client = client or get_client()
    prefix = current_prefix(prefix)
    holds: list[dict[str, Any]] = []
    with unavailable_on_connection_error():
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        lock_keys = _scan(client, f"{glob_escape(prefix)}:lock:{{*}}")
        semaphore_keys = _scan(client, f"{glob_escape(prefix)}:semaphore:{{*}}")

        pipe = client.pipeline(transaction=False)
        for name in lock_keys:
            pipe.hgetall(name)
            pipe.pttl(name)
        lock_rows = pipe.execute() if lock_keys else []
        for index, name in enumerate(lock_keys):
            user_key = split_key(name, lock.PRIMITIVE, prefix)
            fields, ttl_ms = lock_rows[2 * index], lock_rows[2 * index + 1]
            if user_key is None or not fields:
                continue
            holds.append(
                {
                    "primitive": lock.PRIMITIVE,
                    "key": user_key,
                    "owner": fields.get("owner"),
                    "step": fields.get("step") or None,
                    "execution": fields.get("execution") or None,
                    "reactor": fields.get("reactor") or None,
                    "acquired_at": _ms_to_s(fields.get("acquired_at")),
                    "ttl_left": ttl_ms / 1000 if ttl_ms and ttl_ms > 0 else None,
                    "count": int(fields.get("count") or 0),
                    "token": int(fields["token"]) if fields.get("token") else None,
                }
            )

        pipe = client.pipeline(transaction=False)
        for name in semaphore_keys:
            pipe.zrange(name, 0, -1, withscores=True)
            pipe.hgetall(f"{name}:holders")
        semaphore_rows = pipe.execute() if semaphore_keys else []
        node_now_ms: dict[str, int] = {}
        for index, name in enumerate(semaphore_keys):
            user_key = split_key(name, semaphore.PRIMITIVE, prefix)
            if user_key is None:
                continue
            if is_cluster(client):
                # leases carry their own node's clock: compare with that node's TIME
                node = client.get_node_from_key(name).name
                if node not in node_now_ms:
                    node_seconds, node_micros = server_time(client, name)
                    node_now_ms[node] = node_seconds * 1000 + node_micros // 1000
                now_ms = node_now_ms[node]
            leases, infos = semaphore_rows[2 * index], semaphore_rows[2 * index + 1]
            for owner, expiry_ms in leases:
                if expiry_ms <= now_ms:
                    continue  # lapsed: the slot is free, purged at the next admission
                info = json.loads(infos.get(owner) or "{}")
                holds.append(
                    {
                        "primitive": semaphore.PRIMITIVE,
                        "key": user_key,
                        "owner": owner,
                        "step": info.get("step") or None,
                        "execution": info.get("execution") or None,
                        "reactor": info.get("reactor") or None,
                        "acquired_at": _ms_to_s(info.get("acquired_at")),
                        "ttl_left": (expiry_ms - now_ms) / 1000,
                        "count": int(info.get("count", 1)),
                        "token": None,
                    }
                )
    holds.sort(key=lambda h: (h["primitive"], h["key"], h["acquired_at"] or 0))
    return holds


def _scan(client: Any, pattern: str) -> list[str]:
    # SCAN from Python, never inside a script: it is an operator read, not an admission
    return sorted(set(client.scan_iter(match=pattern, count=500)))


def _ms_to_s(value: Any) -> float | None:
    return int(float(value)) / 1000 if value not in (None, "") else None
