"""Whether the coordination Redis may evict reactor_app's keys, and what to change.

WHY: every hold is a key with a TTL. A Redis with ``maxmemory`` set and any
``maxmemory-policy`` but ``noeviction`` frees memory by deleting keys: ``allkeys-*`` any key,
``volatile-*`` only keys with a TTL — that is, exactly the holds. A lock evicted is a lock
released behind its holder's back: the next admission lets a second holder in while the first
still runs its body, and a semaphore slot or a rate-limit window evicted admits one more than
the limit. With ``noeviction`` a full Redis refuses the write instead, the admission fails
with ``CoordinationUnavailable`` (``coordination.redis``), and the protected work does not run
(docs/operations.md, "Redis memory").

``eviction_risks(topology)`` reads ``INFO memory`` of every data server — the one server, the
master the sentinels name, every primary of a cluster — and returns one line per server that
may evict. ``INFO`` is allowed on managed services that refuse ``CONFIG GET``; when an ACL
refuses it too, or nothing answers, there is nothing to say (the reachability checks report a
server that does not answer). The deploy-tagged system check ``reactor_app.W004`` and
``manage.py reactor_redis status`` call it.
"""

from __future__ import annotations

from typing import Any

import redis as redis_py
from redis.cluster import RedisCluster

from reactor_app.coordination.topology import Topology

#: the one policy under which Redis never deletes a key to make room
SAFE_POLICY = "noeviction"


def eviction_risks(topology: Topology) -> list[str]:
    """One line per data server of ``topology`` that may evict keys: where, its policy and its
    ``maxmemory``. A server without ``maxmemory`` (0: no limit) never evicts, whatever its
    policy says."""
    client = topology.connect()
    try:
        memory = _memory_of_each_server(client, topology)
    except redis_py.exceptions.RedisError:
        return []  # refused by an ACL, or not answering: nothing to tell from here
    finally:
        client.close()
    risks = []
    for where, info in sorted(memory.items()):
        policy = str(info.get("maxmemory_policy") or SAFE_POLICY)
        limit = int(info.get("maxmemory") or 0)
        if limit and policy != SAFE_POLICY:
            shown = info.get("maxmemory_human") or f"{limit} bytes"
            risks.append(f"{where}: maxmemory-policy {policy}, maxmemory {shown}")
    return risks


def _memory_of_each_server(client: Any, topology: Topology) -> dict[str, dict[str, Any]]:
    if isinstance(client, RedisCluster):
        answers = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        if "maxmemory" in answers:  # a cluster of one primary: its INFO itself
            return {topology.describe(): dict(answers)}
        return {str(node): dict(info) for node, info in answers.items()}  # node -> its INFO
    return {topology.describe(): dict(client.info("memory"))}


def eviction_hint() -> str:
    """What to change, for every server ``eviction_risks`` names."""
    return (
        "set maxmemory-policy noeviction on it (CONFIG SET maxmemory-policy noeviction, and in "
        "its configuration), or give reactor_app a Redis of its own: an evicted lock, "
        "semaphore slot or rate-limit window lets a second holder in while the first runs"
    )
