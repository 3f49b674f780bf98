"""Where the coordination Redis is — one server, a Redis Cluster or a Sentinel-watched master —
as a value, and the redis-py client built from it.

The settings that spell it (``REACTOR_REDIS_URL``, ``REACTOR_REDIS``) are read and checked in
``coordination.topology_settings``; what a configured server turns out to be when asked (a
sentinel URL at a plain server, a one-server URL at a cluster node...) is told by
``coordination.probe``. Three pieces a reader names apart — the value, the spelling, the
server's answer — so each stays small: the parsers need the value, the value needs neither.

The parsers used to live here; ``from reactor_app.coordination.topology import from_url`` (and
``from_dict``, ``configured_topology``...) still works for code written against that layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import redis as redis_py
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

Kind = Literal["standalone", "cluster", "sentinel"]

#: seconds to wait for a TCP/unix connection before declaring Redis unreachable
CONNECT_TIMEOUT = 5.0
#: seconds a single command may take; scripts are short, so a stuck socket is an outage
COMMAND_TIMEOUT = 10.0


@dataclass(frozen=True)
class Topology:
    """A parsed coordination-Redis configuration (hashable: it keys the client cache)."""

    kind: Kind
    #: standalone: the server's URL without credentials in the query (redis-py parses it)
    url: str | None = None
    #: cluster startup nodes or sentinels, as (host, port)
    nodes: tuple[tuple[str, int], ...] = ()
    service_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    tls: tuple[tuple[str, Any], ...] = ()
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    sentinel_ssl: bool = False
    #: extra redis-py client keyword arguments (``REACTOR_REDIS["options"]``)
    options: tuple[tuple[str, Any], ...] = ()

    # -- description ----------------------------------------------------------------------

    def describe(self) -> str:
        """A one-line description without secrets (for logs, ``reactor_redis status``)."""
        who = f"{self.username}@" if self.username else ""
        tls = " over TLS" if self.ssl else ""
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        if self.kind == "cluster":
            return f"Redis Cluster via {who}{hosts}{tls}"
        if self.kind == "sentinel":
            return f"master {self.service_name!r} (db {self.db}) of sentinels {who}{hosts}{tls}"
        return f"Redis at {redacted(self.url or '')}"

    # -- client ---------------------------------------------------------------------------

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments every data connection of this topology gets."""
        kwargs: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": COMMAND_TIMEOUT,
            # No automatic re-sends: re-sending an admission whose reply was lost would
            # re-enter a lock and leak a nesting level. A failed call surfaces as
            # CoordinationUnavailable and the caller (a worker delivery) retries it whole.
            "retry": Retry(NoBackoff(), 0),
        }
        if self.username:
            kwargs["username"] = self.username
        if self.password:
            kwargs["password"] = self.password
        if self.ssl and self.kind != "standalone":
            kwargs["ssl"] = True
        if self.ssl:
            kwargs.update(_tls_kwargs(dict(self.tls)))
        kwargs.update(dict(self.options))
        return kwargs

    def sentinel_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the connections to the sentinels themselves (their own
        credentials and TLS switch: sentinels often run without the data nodes' ACL)."""
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": COMMAND_TIMEOUT,
            "decode_responses": True,
        }
        if self.sentinel_username:
            kwargs["username"] = self.sentinel_username
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        if self.sentinel_ssl:
            kwargs["ssl"] = True
            kwargs.update(_tls_kwargs(dict(self.tls)))
        return kwargs

    def connect(self) -> Any:
        """A new redis-py client (``Redis``, ``RedisCluster`` or a Sentinel master client)."""
        kwargs = self.connection_kwargs()
        if self.kind == "cluster":
            retry = kwargs.pop("retry")
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in self.nodes],
                # MOVED/ASK/TRYAGAIN are followed inside the client whatever this says; the
                # retry object only re-sends after connection errors and CLUSTERDOWN, which
                # must not happen for an admission (see connection_kwargs)
                retry=retry,
                **kwargs,
            )
        if self.kind == "sentinel":
            sentinel = Sentinel(list(self.nodes), sentinel_kwargs=self.sentinel_kwargs())
            return sentinel.master_for(self.service_name, db=self.db, **kwargs)
        assert self.url is not None
        pool = redis_py.ConnectionPool.from_url(self.url, **kwargs)
        return redis_py.Redis(connection_pool=pool)


def _tls_kwargs(tls: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in tls.items() if value is not None}


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, tail = rest.rpartition("@")
    if ":" in credentials:
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{tail}"
    return url


#: names that moved to ``coordination.topology_settings``, still importable from here
_MOVED_TO_SETTINGS = frozenset(
    {
        "CERT_REQS",
        "CLUSTER_SCHEMES",
        "DEFAULT_PORTS",
        "DICT_KEYS",
        "EMBEDDED_VALUES",
        "SENTINEL_SCHEMES",
        "STANDALONE_SCHEMES",
        "TLS_OPTIONS",
        "cached_from_url",
        "configured_topology",
        "from_dict",
        "from_url",
        "is_topology_url",
        "parse_host_port",
    }
)


def __getattr__(name: str) -> Any:
    # Resolved on first use, not imported at the top: topology_settings imports this module.
    if name in _MOVED_TO_SETTINGS:
        from reactor_app.coordination import topology_settings

        return getattr(topology_settings, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
