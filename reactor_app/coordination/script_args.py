"""What the admission, release and extend scripts are sent: each claim's key group and spec.

A claim's keys come first in its group, as its primitive module lays them out; a lock's or a
semaphore's group ends with the live-holds index keys (``coordination.holds_index``; on a
cluster, the shard of the hold's hash slot), which its spec then names (``ik``). The specs of
one call are sent as one JSON list, ``{"p": primitive, "n": key count, ...its own fields}``
each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from reactor_app.coordination import holds_index, lock, rate_limit, semaphore
from reactor_app.coordination.claims import Claim, Hold, LockClaim, RateLimitClaim, SemaphoreClaim
from reactor_app.coordination.primitives import HOLDING, REGISTRY


def admit_part(claim: Claim, prefix: str, sharded: bool) -> tuple[tuple[str, ...], str]:
    """A claim's keys and its admission spec as a JSON fragment, built once per claim (the
    same declaration on the same key hits the cache): no per-call key building or JSON
    encoding of what never changes. A lock's or semaphore's group ends with the live-holds
    index keys — ``sharded`` (a cluster): its hash slot's shard of the index. A semaphore of
    a named limit (or a named rate limit) is looked up with the limit in force now
    (``semaphore.live_claim``, ``rate_limit.live_claim``)."""
    if type(claim) is SemaphoreClaim and claim.limit_name is not None:
        claim = semaphore.live_claim(claim)
    elif type(claim) is RateLimitClaim and claim.limit_name is not None:
        claim = rate_limit.live_claim(claim)
    try:
        return _cached_admit_part(claim, prefix, sharded)
    except TypeError:  # a claim with an unhashable field: built every time, as before
        return _build_admit_part(claim, prefix, sharded)


def _build_admit_part(claim: Claim, prefix: str, sharded: bool) -> tuple[tuple[str, ...], str]:
    module = REGISTRY[claim.primitive]
    keys = list(module.admit_keys(claim, prefix))
    if claim.primitive in HOLDING:
        keys.extend(holds_index.keys_for(claim.key, prefix, sharded=sharded))
    spec = {
        "p": claim.primitive,
        "n": len(keys),
        **module.admit_spec(claim),
        **index_spec(claim, keys),
    }
    return tuple(keys), json.dumps(spec)


_cached_admit_part = lru_cache(maxsize=4096)(_build_admit_part)


@lru_cache(maxsize=4096)
def lock_keys(user_key: str, prefix: str, sharded: bool, *, admit: bool) -> tuple[str, ...]:
    """A lock's keys for the fast-path scripts (built once per key), index keys last (on a
    cluster, ``sharded``, its hash slot's shard)."""
    claim = LockClaim(user_key)
    keys = lock.admit_keys(claim, prefix) if admit else lock.release_keys(claim, prefix)
    keys.extend(holds_index.keys_for(user_key, prefix, sharded=sharded))
    return tuple(keys)


def specs(
    holds: list[Hold], groups: list[list[str]], spec: Callable[[Hold], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The per-hold argument specs of a script call: primitive, key count and its own fields."""
    return [
        {"p": h.claim.primitive, "n": len(g), **spec(h), **index_spec(h.claim, g)}
        for h, g in zip(holds, groups, strict=True)
    ]


def index_spec(claim: Claim, group: list[str]) -> dict[str, Any]:
    """``ik`` (the user key) for a group that ends with the live-holds index keys."""
    if claim.primitive in HOLDING and holds_index.is_index_group(group):
        return {"ik": claim.key}
    return {}
