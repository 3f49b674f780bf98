"""What the configured coordination Redis turns out to be when asked, and what to change.

A topology can parse and still name the wrong thing: a ``redis+sentinel://`` URL at a plain
server, a Sentinel service name the sentinels do not know, a ``redis+cluster://`` URL at a
server without cluster mode, a one-server URL at one node of a cluster (calls then fail with
``MOVED`` or ``CROSSSLOT`` for the keys of other nodes), or a host nothing answers on. Parsing
cannot tell these; the server can, in one or two short commands.

Two users:

* ``probe(topology)`` connects with a short timeout and returns a ``Finding`` (the problem and
  the hint) or ``None``. The deploy-tagged system check (``manage.py check --deploy``,
  ``reactor_app.E031``) and ``manage.py reactor_redis status`` call it. Plain ``manage.py
  check`` stays offline: it runs on build machines that cannot reach production Redis.
* ``hint_for(exc)`` words the same advice from an exception alone, without a round trip, for
  the ``CoordinationUnavailable`` a step gets at the call (``coordination.redis``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from reactor_app.coordination.topology import Topology

#: seconds the probe waits for a connection or a reply: a deploy check must not hang
PROBE_TIMEOUT = 2.0

#: how a server without Sentinel words its refusal of ``SENTINEL ...`` (Redis 6 quotes the name
#: with a backtick, Redis 7 with an apostrophe)
_NO_SENTINEL_COMMAND = re.compile(r"unknown command [`']sentinel[`']", re.IGNORECASE)
#: redis-py's cluster client, asked to map a server that has no cluster mode
_NOT_A_CLUSTER = "Cluster mode is not enabled"
#: ... and when no startup node answers at all
_CLUSTER_UNREACHABLE = "Redis Cluster cannot be connected"


@dataclass(frozen=True)
class Finding:
    """A configured topology that cannot work as configured."""

    #: what is wrong, naming the address that answered (or did not)
    problem: str
    #: what to change
    hint: str


# --------------------------------------------------------------------------------------------
# advice, shared by the probe and the errors at the call


def _dead_hint(setting: str) -> str:
    return (
        f"check the host and port in {setting}, that the server runs, and that this machine can "
        "reach it (a firewall, a security group, a wrong network)"
    )


def _not_a_sentinel_hint(setting: str) -> str:
    return (
        f"{setting} is a redis+sentinel:// URL but the server it names is not a Sentinel: point "
        "it at the sentinels (port 26379 by default), or, for this one server, use "
        "redis://host:port/<db>"
    )


def _unknown_service_hint(setting: str) -> str:
    return (
        f"put the name the sentinels monitor in {setting} (redis+sentinel://host:26379/<name>/<db> "
        "or REACTOR_REDIS['service_name']); `SENTINEL MASTERS` on a sentinel lists them"
    )


def _not_a_cluster_hint(setting: str) -> str:
    return (
        f"{setting} is a redis+cluster:// URL but the server has no cluster mode: for one server "
        "use redis://host:port/<db>"
    )


def _cluster_node_hint(setting: str) -> str:
    return (
        f"the server is a Redis Cluster node: configure {setting} as "
        "redis+cluster://host:port/ (or REACTOR_REDIS = {'cluster': True, 'startup_nodes': "
        "[...]}), so every key reaches the node that serves it"
    )


def _auth_hint(setting: str) -> str:
    return f"check the username and password in {setting} (the server's ACL users)"


def hint_for(exc: BaseException, setting: str = "REACTOR_REDIS_URL") -> str | None:
    """What to change, told from the exception a call met (``None`` when it says nothing
    about the configuration). No network: this runs on the failing call's path."""
    text = str(exc)
    if isinstance(exc, redis_py.exceptions.AuthenticationError):
        return _auth_hint(setting)
    if isinstance(exc, redis_py.exceptions.ResponseError) and _NO_SENTINEL_COMMAND.search(text):
        return _not_a_sentinel_hint(setting)
    if isinstance(exc, MasterNotFoundError):
        # redis-py lists the sentinels it could not reach after the name; without that list
        # every sentinel answered and none knows a master of that name (or all call it down)
        if " : " in text:
            return _dead_hint(setting)
        return _unknown_service_hint(setting)
    if isinstance(exc, (redis_py.exceptions.AskError, redis_py.exceptions.ClusterCrossSlotError)):
        return _cluster_node_hint(setting)
    if isinstance(exc, redis_py.exceptions.RedisClusterException):
        # the cluster client words every startup failure as "Redis Cluster cannot be
        # connected...: <what the last node said>"
        if _NOT_A_CLUSTER in text:
            return _not_a_cluster_hint(setting)
        if text.startswith(_CLUSTER_UNREACHABLE):
            return _dead_hint(setting)
    if isinstance(exc, redis_py.exceptions.NoPermissionError) or (
        isinstance(exc, redis_py.exceptions.ResponseError) and "can't run this command" in text
    ):
        return (
            f"grant the ACL user of {setting} what reactor_app uses (docs/operations.md, "
            '"Redis ACL"): the scripts (EVALSHA and SCRIPT LOAD, or FCALL and FUNCTION LOAD), '
            "the keys under REACTOR_KEY_PREFIX and their wake channels"
        )
    if isinstance(exc, redis_py.exceptions.OutOfMemoryError):
        return (
            "the server reached its maxmemory: raise it or free memory on that server (keep "
            "maxmemory-policy noeviction, which refuses writes rather than evicting holds)"
        )
    if isinstance(
        exc, (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError, OSError)
    ):
        return _dead_hint(setting)
    return None


def is_wrong_topology(exc: BaseException) -> bool:
    """True for the replies that mean "not the kind of server configured" rather than an
    outage: a plain server refusing ``SENTINEL``, a server without cluster mode. Both surface
    as ``CoordinationUnavailable`` (the call cannot be answered) with ``hint_for``'s advice."""
    if isinstance(exc, redis_py.exceptions.ResponseError):
        return _NO_SENTINEL_COMMAND.search(str(exc)) is not None
    return False


# --------------------------------------------------------------------------------------------
# the probe


def probe(
    topology: Topology, setting: str = "REACTOR_REDIS_URL", timeout: float = PROBE_TIMEOUT
) -> Finding | None:
    """Ask the configured servers what they are; a ``Finding`` when it cannot work."""
    if topology.kind == "sentinel":
        return _probe_sentinels(topology, setting, timeout)
    if topology.kind == "cluster":
        return _probe_cluster(topology, setting, timeout)
    return _probe_server(topology, setting, timeout)


def _short(kwargs: dict[str, Any], timeout: float) -> dict[str, Any]:
    return {
        **kwargs,
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }


def _mode(client: Any) -> str | None:
    """``redis_mode`` of ``INFO server`` (standalone, cluster, sentinel); None when the ACL
    forbids ``INFO`` — then the probe has nothing to say about the kind of server."""
    try:
        info = client.info("server")
    except redis_py.exceptions.ResponseError:
        return None
    mode = info.get("redis_mode")
    return str(mode) if mode else None


def _unreachable(where: str, exc: BaseException, setting: str) -> Finding:
    hint = hint_for(exc, setting) or _dead_hint(setting)
    return Finding(f"the coordination Redis at {where} does not answer ({exc})", hint)


def _probe_server(topology: Topology, setting: str, timeout: float) -> Finding | None:
    assert topology.url is not None
    where = topology.describe().removeprefix("Redis at ")
    client = redis_py.Redis.from_url(topology.url, **_short(topology.connection_kwargs(), timeout))
    try:
        client.ping()
        mode = _mode(client)
    except redis_py.exceptions.ConnectionError as exc:
        return _unreachable(where, exc, setting)
    except redis_py.exceptions.TimeoutError as exc:
        return _unreachable(where, exc, setting)
    finally:
        client.close()
    if mode == "cluster":
        return Finding(
            f"{where} is a Redis Cluster node, configured as one server: keys served by other "
            "nodes fail with MOVED, scripts over several slots with CROSSSLOT",
            _cluster_node_hint(setting),
        )
    if mode == "sentinel":
        return Finding(
            f"{where} is a Sentinel, not a data server",
            f"use redis+sentinel://host:port/<master name>/<db> in {setting}",
        )
    return None


def _probe_cluster(topology: Topology, setting: str, timeout: float) -> Finding | None:
    kwargs = _short(topology.connection_kwargs(), timeout)
    failures: list[Finding] = []
    for host, port in topology.nodes:
        client = redis_py.Redis(host=host, port=port, **kwargs)
        try:
            mode = _mode(client)
        except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError) as exc:
            failures.append(_unreachable(f"{host}:{port}", exc, setting))
            continue
        finally:
            client.close()
        if mode == "standalone":
            return Finding(
                f"{host}:{port} has no cluster mode (a standalone server)",
                _not_a_cluster_hint(setting),
            )
        if mode == "sentinel":
            return Finding(
                f"{host}:{port} is a Sentinel, not a cluster node",
                f"use redis+sentinel://host:port/<master name>/<db> in {setting}",
            )
    # one startup node answering is enough: the client learns the others from it
    if len(failures) == len(topology.nodes):
        return failures[0]
    return None


def _probe_sentinels(topology: Topology, setting: str, timeout: float) -> Finding | None:
    kwargs = _short(topology.sentinel_kwargs(), timeout)
    failures: list[Finding] = []
    known: set[str] = set()
    for host, port in topology.nodes:
        client = redis_py.Redis(host=host, port=port, **kwargs)
        try:
            # master name -> its state (redis-py parses SENTINEL MASTERS into a dict)
            masters: Any = client.sentinel_masters()
        except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError) as exc:
            failures.append(_unreachable(f"sentinel {host}:{port}", exc, setting))
            continue
        except redis_py.exceptions.ResponseError as exc:
            if not _NO_SENTINEL_COMMAND.search(str(exc)):
                raise
            return Finding(
                f"{host}:{port} is not a Sentinel (it refuses the SENTINEL command)",
                _not_a_sentinel_hint(setting),
            )
        finally:
            client.close()
        if not isinstance(masters, dict):  # a RESP3 list of states: their names
            masters = {state.get("name"): state for state in masters}
        if topology.service_name in masters:
            return _probe_master(topology, setting, timeout)
        known.update(str(name) for name in masters)
    if len(failures) == len(topology.nodes):
        return failures[0]
    names = ", ".join(repr(name) for name in sorted(known)) or "none"
    return Finding(
        f"the sentinels know no master named {topology.service_name!r} (they know: {names})",
        _unknown_service_hint(setting),
    )


def _probe_master(topology: Topology, setting: str, timeout: float) -> Finding | None:
    """The master the sentinels name, asked for a PING (a master they report but nobody can
    reach from here — a wrong announce address — fails every call)."""
    sentinel = Sentinel(
        list(topology.nodes), sentinel_kwargs=_short(topology.sentinel_kwargs(), timeout)
    )
    client = sentinel.master_for(
        topology.service_name, db=topology.db, **_short(topology.connection_kwargs(), timeout)
    )
    try:
        client.ping()
    except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError) as exc:
        return _unreachable(f"master {topology.service_name!r}", exc, setting)
    finally:
        client.close()
    return None
