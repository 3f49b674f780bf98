"""The coordination Redis: client, key names, the Lua script registry and its status codes.

* ``get_client()`` returns a redis-py client for the configured topology (``REACTOR_REDIS`` /
  ``REACTOR_REDIS_URL``: one server, a Redis Cluster or a Sentinel-watched master, see
  ``coordination.topology``) — or for the embedded development server when
  ``REACTOR_REDIS_URL = "embedded"`` — shared per configuration within a process. One-server
  URLs are built through django-redis's connection factory (one pool per URL); cluster and
  Sentinel clients by ``Topology.connect``.
* ``key()`` builds every Redis key name. The user key sits inside a hash tag
  (``reactor:lock:{acct:1}``), and sub-keys keep that tag (``reactor:lock:{acct:1}:fence``), so
  all the data of one user key lives in one cluster slot and multi-key scripts stay legal.
* ``Scripts`` registers every ``lua/<operation>.lua`` file of the package (read through
  ``importlib.resources``, so it works from a wheel or a zip) on one client. Every script answers
  ``{status_code, json_payload}``; ``STATUSES`` is the one table that says what each code means.
* Connection failures of any script call or read become ``CoordinationUnavailable`` — and so
  do the cluster and failover answers a client could not resolve itself (``CLUSTERDOWN``,
  ``TRYAGAIN``, a ``MOVED``/``ASK`` still redirecting after the client's hops, ``READONLY``
  from a demoted master, an uncovered slot): they are outages of coordination, not failures
  of the step, and a worker delivery that meets one is retried.
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis as redis_py
from django_redis.pool import ConnectionFactory

from reactor_app.conf import reactor_settings
from reactor_app.coordination import claims as claim_types
from reactor_app.coordination import embedded
from reactor_app.coordination.topology import (
    COMMAND_TIMEOUT,
    CONNECT_TIMEOUT,
    Topology,
    cached_from_url,
    configured_topology,
    is_topology_url,
)
from reactor_app.exceptions import (
    ConfigurationError,
    CoordinationError,
    CoordinationUnavailable,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    PeriodInFlightError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
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
    """Give a forked child its own pools instead of the parent's sockets."""
    global _factory
    global _default_client
    _factory = None
    _default_client = None
    _clients.clear()
    _CoordinationConnectionFactory._pools = {}
    _scripts_by_client.clear()
    _embedded_urls.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_connections_after_fork)


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

    ``url`` may be any URL ``coordination.topology`` understands, ``redis+cluster://`` and
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
    """True for a redis-py cluster client, whose multi-key scripts need one hash slot."""
    return isinstance(client, redis_py.RedisCluster)


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


def hash_slot(redis_key: str) -> int:
    from redis.crc import key_slot

    return int(key_slot(redis_key.encode()))


# --------------------------------------------------------------------------------------------
# Key names
# --------------------------------------------------------------------------------------------

# A brace inside the user key would move the hash tag; percent-encoding them (and "%" itself,
# so the mapping stays reversible) keeps every key of one user key in one slot.
_BRACE_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
_BRACE_UNESCAPE = re.compile(r"%(25|7B|7D)")


def encode_user_key(user_key: str) -> str:
    if not isinstance(user_key, str) or not user_key:
        raise ValueError(f"a coordination key must be a non-empty string, got {user_key!r}")
    if not any(ch in user_key for ch in _BRACE_ESCAPES):
        return user_key
    return "".join(_BRACE_ESCAPES.get(ch, ch) for ch in user_key)


def decode_user_key(encoded: str) -> str:
    return _BRACE_UNESCAPE.sub(lambda m: {"25": "%", "7B": "{", "7D": "}"}[m.group(1)], encoded)


def current_prefix(prefix: str | None = None) -> str:
    """The key prefix: the explicit one, else ``REACTOR_KEY_PREFIX`` (read on every call)."""
    return prefix if prefix is not None else reactor_settings.KEY_PREFIX


def key(primitive: str, user_key: str, *parts: str, prefix: str | None = None) -> str:
    """``{prefix}:{primitive}:{<user_key>}[:part...]`` — the one place key names are built."""
    return _key(current_prefix(prefix), primitive, user_key, parts)


@lru_cache(maxsize=8192)
def _key(prefix: str, primitive: str, user_key: str, parts: tuple[str, ...]) -> str:
    # cached: every admission builds several names for the same few hot keys
    name = f"{prefix}:{primitive}:{{{encode_user_key(user_key)}}}"
    return ":".join((name, *parts)) if parts else name


def split_key(redis_key: str, primitive: str, prefix: str | None = None) -> str | None:
    """The user key of a base key ``{prefix}:{primitive}:{<user_key>}``; None for other keys."""
    head = f"{current_prefix(prefix)}:{primitive}:{{"
    if not (redis_key.startswith(head) and redis_key.endswith("}")):
        return None
    encoded = redis_key[len(head) : -1]
    if "{" in encoded or "}" in encoded:  # a sub-key such as "...}:fence" never ends with "}"
        return None
    return decode_user_key(encoded)


def glob_escape(text: str) -> str:
    """Escape Redis glob metacharacters so a prefix matches itself only in SCAN MATCH."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


@lru_cache(maxsize=1024)
def holder_json(holder: claim_types.Holder) -> str:
    """A holder as the scripts' ``holder json`` argument (attribution of every hold)."""
    fields = {
        "owner": holder.owner,
        "execution": holder.execution_id,
        "step": holder.step,
        "reactor": holder.reactor,
    }
    return json.dumps({k: v for k, v in fields.items() if v is not None})


# --------------------------------------------------------------------------------------------
# Status codes: the one table
# --------------------------------------------------------------------------------------------


class Status(IntEnum):
    """Status codes answered by the Lua scripts (first element of every reply).

    ``lua/_common.lua`` declares the same names and values for the scripts; a unit test
    (``test_lua_status_codes_match_the_python_enum``) fails when the two differ.
    """

    OK = 0
    LOCKED = 1
    SEMAPHORE_FULL = 2
    RATE_LIMITED = 3
    PERIOD_MARKED = 4
    ORDERED_WAIT = 5
    ORDERED_STALE = 6
    CHAIN_FAILED = 7
    LOST = 8
    NOT_FOUND = 9
    PERIOD_IN_FLIGHT = 10


@dataclass(frozen=True)
class StatusMeaning:
    """What a status code means to Python: the result type built and the error it maps to."""

    name: str
    result: type | None
    error: type[CoordinationError] | None


STATUSES: dict[Status, StatusMeaning] = {
    Status.OK: StatusMeaning("ok", claim_types.Admitted, None),
    Status.LOCKED: StatusMeaning("locked", claim_types.Refused, LockAcquisitionError),
    Status.SEMAPHORE_FULL: StatusMeaning(
        "semaphore_full", claim_types.Refused, SemaphoreAcquisitionError
    ),
    Status.RATE_LIMITED: StatusMeaning("rate_limited", claim_types.Refused, RateLimitExceeded),
    Status.PERIOD_MARKED: StatusMeaning("period_marked", claim_types.PeriodHit, None),
    Status.ORDERED_WAIT: StatusMeaning("ordered_wait", claim_types.Refused, OrderedLockWaitError),
    # a position from before a reset, or one already passed over: the caller must re-assign
    Status.ORDERED_STALE: StatusMeaning("ordered_stale", claim_types.Refused, OrderedLockWaitError),
    Status.CHAIN_FAILED: StatusMeaning("chain_failed", claim_types.ChainFailed, None),
    Status.LOST: StatusMeaning("lost", None, LeaseLost),
    Status.NOT_FOUND: StatusMeaning("not_found", None, None),
    # another owner's reservation of the period bucket is live: contention, not a skip
    Status.PERIOD_IN_FLIGHT: StatusMeaning(
        "period_in_flight", claim_types.Refused, PeriodInFlightError
    ),
}


@dataclass(frozen=True)
class ScriptReply:
    """A decoded script answer: its status and its JSON payload."""

    status: Status
    data: dict[str, Any]


# --------------------------------------------------------------------------------------------
# Scripts
# --------------------------------------------------------------------------------------------

LUA_PACKAGE = "reactor_app.coordination"
LUA_FOLDER = "lua"
_INCLUDE = re.compile(r"^-- @include (\S+\.lua)\s*$", re.MULTILINE)


def _lua_folder() -> Any:
    return resources.files(LUA_PACKAGE).joinpath(LUA_FOLDER)


@cache
def script_sources() -> dict[str, str]:
    """``{operation: source}`` for every ``lua/<operation>.lua`` of the installed package.

    Files starting with ``_`` are shared fragments, spliced into operations by a
    ``-- @include _name.lua`` line, not operations themselves.
    """
    folder = _lua_folder()
    fragments: dict[str, str] = {}
    operations: dict[str, str] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua"):
            continue
        text = entry.read_text(encoding="utf-8")
        if entry.name.startswith("_"):
            fragments[entry.name] = text
        else:
            operations[entry.name[: -len(".lua")]] = text

    def splice(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise RuntimeError(f"lua include {name!r} not found in {LUA_PACKAGE}/{LUA_FOLDER}")
        return fragments[name]

    return {name: _INCLUDE.sub(splice, text) for name, text in sorted(operations.items())}


class Scripts:
    """Every operation script registered on one client; ``run`` calls one and decodes it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._scripts = {
            name: client.register_script(source) for name, source in script_sources().items()
        }
        #: the pool ``call`` takes connections from directly: a plain one-server client's
        #: (a cluster client routes by slot; a single-connection client has no pool to use)
        self._direct_pool: Any = None
        if isinstance(client, redis_py.Redis) and getattr(client, "connection", None) is None:
            self._direct_pool = client.connection_pool

    @property
    def names(self) -> list[str]:
        return sorted(self._scripts)

    def run(
        self,
        operation: str,
        keys: Sequence[str],
        args: Sequence[str | int | float],
        *,
        key: str | None = None,
        primitive: str | None = None,
    ) -> ScriptReply:
        """Run ``operation``; a connection failure becomes ``CoordinationUnavailable``."""
        with unavailable_on_connection_error(key=key, primitive=primitive):
            raw = self.call(operation, keys, args)
        return decode_reply(raw)

    def call(self, operation: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """Run ``operation`` and return its raw answer (the fast-path scripts answer flat
        lists, not ``{status, json}``); the caller maps connection failures.

        On a one-server client the command goes straight to a pooled connection: redis-py's
        generic command path (retry wrapper, event dispatch, metrics hooks, option filtering)
        costs about as much Python time as the round trip itself, and every admission and
        release is a script call (docs/benchmarks.md, "Hot path"). What that
        path does that matters here is kept: a connection whose reply was not read whole is
        dropped, never handed to the next caller, and a script the server no longer has
        (restarted, flushed) is loaded again through ``Script``.
        """
        script = self._scripts[operation]
        pool = self._direct_pool
        if pool is None:
            return script(keys=keys, args=args)
        connection = pool.get_connection()
        try:
            connection.send_packed_command([_pack_evalsha(script.sha, keys, args)])
            return connection.read_response()
        except redis_py.exceptions.NoScriptError:
            pass  # the reply was read whole: the connection is fine
        except redis_py.exceptions.ResponseError:
            raise
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        return script(keys=keys, args=args)

    def queue(
        self, pipeline: Any, operation: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> None:
        """Queue ``operation`` on a pipeline of this client; decode its answer with
        ``decode_reply``."""
        self._scripts[operation](keys=keys, args=args, client=pipeline)


def _pack_evalsha(sha: str, keys: Sequence[str], args: Sequence[str | int | float]) -> bytes:
    """``EVALSHA sha numkeys keys... args...`` as one RESP request.

    The scripts take only text and numbers, encoded as redis-py would (UTF-8; the ``repr`` of a
    number) — without its per-argument type dispatch, which on the single-lock fast path cost
    more than building the bytes.
    """
    parts = [b"EVALSHA", sha.encode(), str(len(keys)).encode()]
    parts.extend(key.encode() for key in keys)
    for arg in args:
        if isinstance(arg, bool):  # ambiguous (1/0 or "True"?): refused, as redis-py does
            raise TypeError(f"script arguments are text or numbers, not {arg!r}")
        parts.append(arg.encode() if isinstance(arg, str) else repr(arg).encode())
    return b"".join(
        [b"*%d\r\n" % len(parts), *(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)]
    )


def decode_reply(raw: Any) -> ScriptReply:
    """A script's raw ``{status, json}`` answer as a ``ScriptReply``."""
    status, payload = raw
    data = json.loads(payload) if payload else {}
    return ScriptReply(Status(int(status)), _lists(data))


def _lists(value: Any) -> Any:
    """cjson encodes an empty Lua table as ``{}``; every payload field we read as a list."""
    if isinstance(value, dict):
        return {k: ([] if v == {} else _lists(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_lists(v) for v in value]
    return value


_scripts_by_client: weakref.WeakKeyDictionary[Any, Scripts] = weakref.WeakKeyDictionary()


def scripts_for(client: Any) -> Scripts:
    """The (cached) script registry of ``client``."""
    scripts = _scripts_by_client.get(client)
    if scripts is None:
        scripts = Scripts(client)
        _scripts_by_client[client] = scripts
    return scripts


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
)


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


#: what a one-server client pointed at a cluster node meets
_WRONG_TOPOLOGY_ERRORS = (redis_py.exceptions.AskError, redis_py.exceptions.ClusterCrossSlotError)


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the coordination Redis cannot answer now (an outage) — or, for
    a one-server client pointed at a cluster node, cannot answer at all (MOVED, CROSSSLOT)."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    if isinstance(exc, redis_py.exceptions.ClusterCrossSlotError):
        return True
    return isinstance(exc, redis_py.exceptions.RedisClusterException) and str(exc).startswith(
        CLUSTER_OUTAGE_MESSAGES
    )


@contextmanager
def unavailable_on_connection_error(
    *, key: str | None = None, primitive: str | None = None
) -> Iterator[None]:
    """Translate connection failures into ``CoordinationUnavailable`` (with the cause)."""
    try:
        yield
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        _forget_embedded()  # the next call checks (and if need be starts) the server again
        hint = ""
        if isinstance(exc, _WRONG_TOPOLOGY_ERRORS):
            # a one-server client pointed at a cluster node sees MOVED (or CROSSSLOT) for most
            # keys
            hint = (
                " (a MOVED/ASK reply reached the library: if this Redis is a cluster, "
                "configure it as redis+cluster://host:port or REACTOR_REDIS = "
                "{'cluster': True, ...})"
            )
        raise CoordinationUnavailable(
            f"the coordination Redis is unreachable ({type(exc).__name__}: {exc}); "
            f"the protected work did not run{hint}",
            key=key,
            primitive=primitive,
            # callers that re-word the error quote the cause: keep the hint with it
            cause=f"{type(exc).__name__}: {exc}{hint}" if hint else exc,
        ) from exc
