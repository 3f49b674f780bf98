"""The coordination Redis client, and what its failures mean.

* ``get_client()`` returns a redis-py client for the configured topology (``REACTOR_REDIS`` /
  ``REACTOR_REDIS_URL``: one server, a Redis Cluster or a Sentinel-watched master, see
  ``coordination.topology_settings``) — or for the embedded development server when
  ``REACTOR_REDIS_URL = "embedded"`` — shared per configuration within a process. One-server
  URLs are built through django-redis's connection factory (one pool per URL); cluster and
  Sentinel clients by ``Topology.connect``.
* Connection failures of any script call or read become ``CoordinationUnavailable`` — and so
  do the cluster and failover answers a client could not resolve itself (``CLUSTERDOWN``,
  ``TRYAGAIN``, a ``MOVED``/``ASK`` still redirecting after the client's hops, ``READONLY``
  from a demoted master, an uncovered slot): they are outages of coordination, not failures
  of the step, and a worker delivery that meets one is retried.

Key names are built in ``coordination.keys``, the Lua scripts called through
``coordination.scripts``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import redis as redis_py
from django_redis.pool import ConnectionFactory

from reactor_app import forks
from reactor_app.conf import reactor_settings
from reactor_app.coordination import embedded
from reactor_app.coordination.probe import hint_for, is_wrong_topology
from reactor_app.coordination.topology import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Topology
from reactor_app.coordination.topology_settings import (
    cached_from_url,
    configured_topology,
    is_topology_url,
)
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationOutOfMemory,
    CoordinationUnavailable,
)

# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class _CoordinationConnectionFactory(ConnectionFactory):  # type: ignore[type-arg]
    """django-redis's factory with a pool registry of its own.

    django-redis keeps its pools in a class-level dict keyed by URL; the cache backend may use
    the very same URL with different options (it wants bytes, we decode to ``str``), so sharing
    that dict would let whichever side connects first decide the other's encoding.
    """

    _pools: dict[str, Any] = {}


_factory: _CoordinationConnectionFactory | None = None
_clients: dict[str | Topology, Any] = {}
#: ``get_client()``'s answer and the settings version it was resolved under
_default_client: tuple[int, Any] | None = None
_clients_guard = threading.Lock()


def _connection_factory() -> _CoordinationConnectionFactory:
    global _factory
    if _factory is None:
        _factory = _CoordinationConnectionFactory(
            {
                "SOCKET_CONNECT_TIMEOUT": CONNECT_TIMEOUT,
                "SOCKET_TIMEOUT": COMMAND_TIMEOUT,
                # No automatic retries (redis-py's pool default): re-sending an admission whose
                # reply was lost would re-enter a lock and leak a nesting level.
                "CONNECTION_POOL_KWARGS": {"decode_responses": True},
            }
        )
    return _factory


def _forget_connections_after_fork() -> None:
    """Give a forked child its own pools instead of the parent's sockets — and its own guard:
    a fork while another thread of the parent held it (building a cluster client, which maps
    the slots over the network) would leave the child's copy locked forever."""
    global _factory
    global _default_client
    global _clients_guard
    _clients_guard = threading.Lock()
    _factory = None
    _default_client = None
    _clients.clear()
    _CoordinationConnectionFactory._pools = {}
    _embedded_urls.clear()


forks.after_in_child(_forget_connections_after_fork)


#: embedded state folder -> its URL, once its server answered in this process. Resolving and
#: PINGing the server on every call cost a connection per admission; a connection error
#: (``unavailable_on_connection_error``) forgets it, so a server that died is started again.
_embedded_urls: dict[str, str] = {}


def _forget_embedded() -> None:
    """Forget the embedded servers seen answering (and the client resolved through them)."""
    global _default_client
    _embedded_urls.clear()
    _default_client = None


def redis_url() -> str:
    """The coordination Redis URL: the setting (or ``REACTOR_REDIS``'s ``url``), or for
    ``"embedded"`` the embedded development server (started on demand). Unset is a
    configuration error, never a silent local server. A ``REACTOR_REDIS`` dict without a URL
    (a cluster, a Sentinel set) has no single URL — use ``get_client()``, which understands
    both.
    """
    config = reactor_settings.REDIS
    if config is not None and isinstance(config, dict) and config.get("url"):
        return str(config["url"])
    configured = reactor_settings.REDIS_URL
    if configured is None:
        raise ConfigurationError(
            "REACTOR_REDIS_URL is not set: set it to your Redis server's URL (shared by every "
            'web and worker process), or to "embedded" for a development server on this machine',
            setting="REDIS_URL",
        )
    if not reactor_settings.USES_EMBEDDED_REDIS:
        return configured
    directory = reactor_settings.EMBEDDED_REDIS_DIR or str(Path.cwd() / ".reactor")
    known = _embedded_urls.get(directory)
    if known is not None:
        return known
    embedded.ensure_server(directory)
    resolved = _embedded_urls[directory] = embedded.url(directory)
    return resolved


def _topology_for(url: str | None) -> str | Topology:
    """The client-cache key: a one-server URL as itself, else the parsed topology.

    One-server URLs (``redis://``, ``rediss://`` with its TLS query options, ``unix://``, the
    embedded server) keep the plain path: ``redis_url()`` and django-redis's pool per URL, with
    nothing parsed per call. Only ``REACTOR_REDIS`` and the cluster/Sentinel schemes build a
    ``Topology``.
    """
    if url is None:
        if reactor_settings.REDIS is None and not is_topology_url(reactor_settings.REDIS_URL):
            return redis_url()
        topology = configured_topology()
        if topology is None:  # unreachable in practice: REDIS or a topology URL is set
            return redis_url()
    elif is_topology_url(url):
        topology = cached_from_url(url)
    else:
        return url
    plain = not (topology.options or topology.username or topology.password or topology.tls)
    if topology.kind == "standalone" and topology.url and plain:
        return topology.url
    return topology


def get_client(url: str | None = None) -> Any:
    """A client for ``url`` (default: the configured topology, else the embedded server),
    shared per configuration within this process.

    ``url`` may be any URL ``coordination.topology_settings`` understands, ``redis+cluster://`` and
    ``redis+sentinel://`` included. The client is a ``redis.Redis`` for one server or a
    Sentinel master, a ``redis.cluster.RedisCluster`` for a cluster.
    """
    global _default_client
    if url is None:
        # the configured client, as long as the settings have not changed: resolving the
        # topology reads several settings, and admission asks for the client on every call
        version = reactor_settings.version()
        known = _default_client
        if known is not None and known[0] == version:
            return known[1]
    resolved = _topology_for(url)
    client = _clients.get(resolved)
    if client is None:
        with _clients_guard:
            client = _clients.get(resolved)
            if client is None:
                if isinstance(resolved, str):
                    client = _connection_factory().connect(resolved)
                else:
                    # a cluster client maps the slots as it is built: an unreachable cluster
                    # is an outage here already, not an error of the caller
                    with unavailable_on_connection_error():
                        client = resolved.connect()
                _clients[resolved] = client
    if url is None:
        _default_client = (version, client)
    return client


def is_cluster(client: Any) -> bool:
    """True for a redis-py cluster client, whose multi-key scripts need one hash slot.

    Answered once per client class: ``RedisCluster``'s metaclass is ``typing.Protocol``'s, so
    a plain ``isinstance`` walks its protocol machinery — ~2% of a locked ``Step.call``,
    which asks twice."""
    kind = type(client)
    answer = _cluster_classes.get(kind)
    if answer is None:
        answer = _cluster_classes[kind] = isinstance(client, redis_py.RedisCluster)
    return answer


#: client class -> whether it is a cluster client (``is_cluster``)
_cluster_classes: dict[type, bool] = {}


def server_time(client: Any, near_key: str | None = None) -> tuple[int, int]:
    """Redis ``TIME`` as ``(seconds, microseconds)`` — on a cluster, from the node that serves
    ``near_key``: the scripts stamp leases and windows with their own node's clock, so a read
    comparing against those stamps must use the same clock (node clocks may differ)."""
    if near_key is not None and is_cluster(client):
        seconds, micros = client.time(target_nodes=client.get_node_from_key(near_key))
    else:
        seconds, micros = client.time()
    return int(seconds), int(micros)


def pipeline_with_time(
    client: Any, near_key: str, fill: Callable[[Any], None]
) -> tuple[tuple[int, int], list[Any]]:
    """``(server_time(near_key), results)`` of a read pipeline that ``fill`` queues.

    One round trip on one server (``TIME`` rides in the pipeline); a cluster pipeline cannot
    carry ``TIME``, so there it is asked of ``near_key``'s node first.
    """
    pipe = client.pipeline(transaction=False)
    if is_cluster(client):
        now = server_time(client, near_key)
        fill(pipe)
        return now, list(pipe.execute())
    pipe.time()
    fill(pipe)
    (seconds, micros), *results = pipe.execute()
    return (int(seconds), int(micros)), results


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

#: what "Redis is unreachable" looks like from redis-py (a missing unix socket is an OSError
#: wrapped in ConnectionError; a bare OSError can escape while a socket is being set up)
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_py.exceptions.ConnectionError,
    redis_py.exceptions.TimeoutError,
    ConnectionError,
    TimeoutError,
    OSError,
    # A cluster mid-failover or mid-resharding. The cluster client follows MOVED and ASK and
    # waits out TRYAGAIN itself; what reaches us is what it could not resolve in its hops —
    # CLUSTERDOWN (ClusterError), a slot no node serves, TRYAGAIN or a redirect still bouncing.
    # Nothing was taken in those cases (a script runs on one node or not at all).
    redis_py.exceptions.ClusterError,
    redis_py.exceptions.SlotNotCoveredError,
    redis_py.exceptions.TryAgainError,
    redis_py.exceptions.AskError,  # MovedError is a subclass
    # a master demoted by a Sentinel failover answers writes with READONLY
    redis_py.exceptions.ReadOnlyError,
    # a full server under maxmemory-policy noeviction refuses writes (OOM): nothing was taken,
    # and memory comes back as keys expire (coordination.eviction says why that policy)
    redis_py.exceptions.OutOfMemoryError,
)


#: a full server refusing a write: an outage like the others, worded as what it is
OUT_OF_MEMORY = redis_py.exceptions.OutOfMemoryError


#: redis-py's cluster client reports a cluster it cannot map (no node answers, slots uncovered
#: mid-failover, nodes disagreeing mid-resharding, a URL naming a non-cluster server) with a
#: bare ``RedisClusterException``; the same class also reports programming errors (a blocked
#: pipeline command, cross-slot keys), which must stay loud — so these are told by message.
CLUSTER_OUTAGE_MESSAGES = (
    "Redis Cluster cannot be connected",
    "All slots are not covered",
    "startup_nodes could not agree",
    "Cluster mode is not enabled",
)


#: how Redis words an ACL refusal met inside a script (a plain error, not ``NOPERM``: Redis 7
#: "The user executing the script can't run this command", Redis 6 quotes the ``NOPERM``)
_ACL_REFUSED_IN_SCRIPT = ("can't run this command", "no permissions to")


def refused_by_acl(exc: BaseException) -> bool:
    """Whether ``exc`` is the ACL refusing the configured user a command, a key or a channel —
    at the call (``NOPERM``), or inside a script."""
    if isinstance(exc, redis_py.exceptions.NoPermissionError):
        return True
    return isinstance(exc, redis_py.exceptions.ResponseError) and any(
        text in str(exc) for text in _ACL_REFUSED_IN_SCRIPT
    )


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the coordination Redis cannot answer now (an outage) — or, for
    a server of another kind than configured, cannot answer at all: a one-server client
    pointed at a cluster node (MOVED, CROSSSLOT), a Sentinel URL at a plain server (which
    refuses ``SENTINEL``), a cluster URL at a server without cluster mode."""
    if isinstance(exc, UNAVAILABLE_ERRORS) or refused_by_acl(exc):
        return True
    if isinstance(exc, redis_py.exceptions.ClusterCrossSlotError) or is_wrong_topology(exc):
        return True
    return isinstance(exc, redis_py.exceptions.RedisClusterException) and str(exc).startswith(
        CLUSTER_OUTAGE_MESSAGES
    )


def _configuration_hint(exc: BaseException) -> str | None:
    """What to change in the setting that names the server ``exc`` came from; nothing for the
    embedded server, which this process starts itself."""
    try:
        if reactor_settings.USES_EMBEDDED_REDIS and reactor_settings.REDIS is None:
            return None
        setting = "REACTOR_REDIS" if reactor_settings.REDIS is not None else "REACTOR_REDIS_URL"
    except ConfigurationError:  # a broken setting is reported by the checks
        return None
    return hint_for(exc, setting)


def unusable_state(exc: BaseException | None) -> str:
    """How the coordination Redis is, as an error that makes it unusable says: "out of
    memory", "refusing its ACL user" or (connection failures, a changing cluster, a server of
    another kind than configured) "unreachable"."""
    if isinstance(exc, OUT_OF_MEMORY):
        return "out of memory"
    if exc is not None and refused_by_acl(exc):
        return "refusing its ACL user"
    return "unreachable"


class unavailable_on_connection_error:
    """Translate connection failures into ``CoordinationUnavailable`` (with the cause):
    ``with unavailable_on_connection_error(key=..., primitive=...): ...``.

    A class rather than a ``contextlib.contextmanager`` generator: every admission and release
    enters one, and a generator-based manager costs a generator, its frame and two calls into
    it per use (docs/benchmarks.md, "Hot path")."""

    __slots__ = ("key", "primitive")

    def __init__(self, *, key: str | None = None, primitive: str | None = None) -> None:
        self.key = key
        self.primitive = primitive

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if exc is None or not isinstance(exc, Exception) or not is_unavailable(exc):
            return False  # nothing raised, or not an outage: it propagates as it is
        _forget_embedded()  # the next call checks (and if need be starts) the server again
        # what to change, told from the exception alone (no round trip on the failing path);
        # ``manage.py check --deploy`` asks the server itself (coordination.probe)
        advice = _configuration_hint(exc)
        hint = f" (hint: {advice})" if advice else ""
        # Says nothing of the work: this call may be an admission (nothing ran: the gate
        # says so when it re-words the error), a release or a renewal (the work already ran),
        # a cancel request or an operator's read.
        full = isinstance(exc, OUT_OF_MEMORY)
        error_class = CoordinationOutOfMemory if full else CoordinationUnavailable
        raise error_class(
            f"the coordination Redis is {unusable_state(exc)} ({type(exc).__name__}: {exc}){hint}",
            key=self.key,
            primitive=self.primitive,
            # callers that re-word the error quote the cause: keep the hint with it
            cause=f"{type(exc).__name__}: {exc}{hint}" if hint else exc,
        ) from exc
