"""The Lua scripts: loading and calling them.

``Scripts`` calls every operation (assembled by ``coordination.script_sources`` from the
package's ``lua/`` files) on one client: as a function of the Redis Functions library
(``FCALL``, ``coordination.function_library``) on a server that has Functions, as an
``EVALSHA`` script on one that has not (Redis < 7) and in pipelines. Every script answers
``{status_code, json_payload}``; ``STATUSES`` (``coordination.statuses``, re-exported here for
the modules that read replies) is the one table that says what each code means. A connection
failure of a script call becomes ``CoordinationUnavailable``
(``coordination.redis.unavailable_on_connection_error``); an admission, release or renewal
whose reply was lost is asked again with its request id (``coordination.stored_replies``).
"""

from __future__ import annotations

import itertools
import json
import os
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import redis as redis_py

from reactor_app import forks
from reactor_app.coordination import claims as claim_types
from reactor_app.coordination import function_library
from reactor_app.coordination.kept_connections import KeptConnections, can_keep_connections
from reactor_app.coordination.redis import is_cluster, unavailable_on_connection_error
from reactor_app.coordination.script_sources import primitive_sections, script_sources
from reactor_app.coordination.statuses import (
    STATUSES,
    ScriptReply,
    Status,
    StatusMeaning,
    decode_reply,
)
from reactor_app.coordination.stored_replies import (
    RETRY_SAFE,
    UNKNOWN_OUTCOME,
    NotSent,
    first_send,
    retrying,
    with_retry_safety,
)

__all__ = [
    "STATUSES",
    "ScriptReply",
    "Scripts",
    "Status",
    "StatusMeaning",
    "decode_reply",
    "holder_json",
    "primitive_sections",
    "script_sources",
    "scripts_for",
]


class Scripts:
    """Every operation script registered on one client; ``run`` calls one and decodes it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._scripts = {
            name: client.register_script(source) for name, source in script_sources().items()
        }
        self._functions = function_library.library().functions
        #: False once the server said it has no Functions (``FCALL`` unknown): from then on
        #: this client's calls are ``EVALSHA`` scripts
        self.uses_functions = True
        self._cluster = is_cluster(client)
        #: the pool ``call`` takes connections from directly: a plain one-server client's
        #: (a cluster client routes by slot; a single-connection client has no pool to use)
        self._direct_pool: Any = None
        if isinstance(client, redis_py.Redis) and getattr(client, "connection", None) is None:
            self._direct_pool = client.connection_pool
        #: the connections threads keep of that pool between calls, up to half of its
        #: ``max_connections`` (``coordination.kept_connections``); None when they may not
        #: (then, or past that, one is taken per call)
        self._kept: KeptConnections | None = None
        if self._direct_pool is not None and can_keep_connections(self._direct_pool):
            self._kept = KeptConnections(self._direct_pool)

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

        A ``stored_replies.RETRY_SAFE`` operation carries a request id and is sent again, same
        id, after an unknown outcome (a connection lost or timed out after the request left):
        the script answers a retry with the reply it stored, so it runs at most once and the
        caller learns what it took (``coordination.stored_replies``).
        """
        if operation in RETRY_SAFE:
            keys, args = with_retry_safety(operation, keys, args)
            sends = itertools.count()
            return retrying(lambda: self._send(operation, keys, args, first=next(sends) == 0))
        try:
            return self._send(operation, keys, args)
        except NotSent as not_sent:
            raise not_sent.cause from None

    def _send(
        self,
        operation: str,
        keys: Sequence[str],
        args: Sequence[str | int | float],
        *,
        first: bool = False,
    ) -> Any:
        """One call of ``operation``: its function, or its script (``_send_once``). ``first``:
        the first send of a retry-safe call's request (``stored_replies.first_send``).

        A server without the library (restarted empty, flushed, a cluster master that never
        had it) answers "Function not found": the library is loaded and the call sent again —
        nothing ran, so any operation may be. A server without Functions (Redis < 7) answers
        "unknown command", an ACL that refuses ``FCALL`` "no permissions": the call, and every
        later one on this client, is sent as its ``EVALSHA`` script.
        """
        script = self._scripts[operation]
        function = self._functions.get(operation) if self.uses_functions else None
        try:
            return self._send_once(script, function, keys, args, first)
        except redis_py.exceptions.ResponseError as error:
            if function is None:
                raise
            if function_library.is_missing(error):
                if not self._load_library():
                    function = None
            elif function_library.is_unsupported(error):
                self.uses_functions = False
                function = None
            else:
                raise
        # (still the first send: the refused one ran nothing)
        return self._send_once(script, function, keys, args, first)

    def _load_library(self) -> bool:
        """Load the library; False when a cluster could not take it now (a master down in a
        failover: this call goes as its script, and the next one finds the library missing
        on the new master and loads it there), or when the ACL refuses the user ``FUNCTION
        LOAD`` (this call and every later one go as scripts)."""
        try:
            function_library.load(self.client)
        except redis_py.exceptions.NoPermissionError as refused:
            if not function_library.is_unsupported(refused):
                raise
            self.uses_functions = False
            return False
        except _CLUSTER_CHANGING:
            if not self._cluster:
                raise
            return False
        return True

    def _send_once(
        self,
        script: Any,
        function: str | None,
        keys: Sequence[str],
        args: Sequence[str | int | float],
        first: bool = False,
    ) -> Any:
        """One send of ``function`` (an ``FCALL``), or of ``script`` when None (an
        ``EVALSHA``); ``NotSent`` when no connection could be had (nothing was sent).

        A retry-safe call's ``first`` send skips the script's look for a stored reply
        (``stored_replies.FIRST_SEND``) only when written here, once, onto a connection; the
        ways through redis-py (a cluster, a script to load again) keep the look: redis-py may
        send the same request again on its own.

        On a one-server client the command goes straight to a pooled connection — the calling
        thread's own (``KeptConnections``), or one taken for the call: redis-py's generic
        command path (retry wrapper, event dispatch, metrics hooks, option filtering) costs
        about as much Python time as the round trip itself, and every admission and release is
        a script call (docs/benchmarks.md, "Hot path"). What that path does that matters here
        is kept: a connection whose reply was not read whole is disconnected (its next command
        reconnects), and a script the server no longer has (restarted, flushed) is loaded
        again through ``Script`` (a function it no longer has: ``_send``).
        """
        pool = self._direct_pool
        if pool is None:
            if function is None:
                return script(keys=keys, args=args)
            return self._send_routed(script, function, keys, args)
        try:
            kept = self._kept.get() if self._kept is not None else None
            per_call = kept is None
            connection: Any = pool.get_connection() if per_call else kept
        except UNKNOWN_OUTCOME as exc:
            raise NotSent(exc) from exc
        try:
            sent = first_send(args) if first else args
            if function is None:
                packed = _pack_call(b"EVALSHA", script.sha, keys, sent)
            else:
                packed = _pack_call(b"FCALL", function, keys, sent)
            connection.send_packed_command([packed])
            return connection.read_response()
        except redis_py.exceptions.NoScriptError:
            pass  # the reply was read whole: the connection is fine
        except redis_py.exceptions.ResponseError:
            raise
        except BaseException:
            connection.disconnect()
            raise
        finally:
            if per_call:
                pool.release(connection)
        return script(keys=keys, args=args)

    def _send_routed(
        self, script: Any, function: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """``FCALL function`` through the client's own command path (a cluster client, or a
        client on a single connection).

        On a cluster it is sent to the master of the first key's slot, named: redis-py finds
        the keys of an ``FCALL`` by asking a server (``COMMAND GETKEYS``, one more round trip
        per call; it knows where ``EVALSHA`` keeps them). A named node gets no redirects
        followed and no retries, so when the cluster answers that the slot moved or is not
        served, or the connection failed, this call goes redis-py's general way as its
        ``EVALSHA`` script — which follows the redirect, refreshes the client's slot map for
        the next call, and retries as it always did (a retry-safe operation's resend carries
        the same request id: ``coordination.stored_replies``).
        """
        command = ("FCALL", function, len(keys), *keys, *args)
        if not self._cluster:
            return self.client.execute_command(*command)
        try:
            node = self.client.get_node_from_key(keys[0]) if keys else None
        except redis_py.exceptions.RedisClusterException:
            node = None
        if node is None:
            return script(keys=keys, args=args)
        try:
            return self.client.execute_command(*command, target_nodes=node)
        except _CLUSTER_CHANGING:
            return script(keys=keys, args=args)

    def queue(
        self, pipeline: Any, operation: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> None:
        """Queue ``operation`` on a pipeline of this client; decode its answer with
        ``decode_reply``."""
        if operation in RETRY_SAFE:
            keys, args = with_retry_safety(operation, keys, args)
        self._scripts[operation](keys=keys, args=args, client=pipeline)


#: what a call sent to a named cluster node may meet while the cluster changes (a failover, a
#: resharding): ``Scripts._send_routed`` sends such a call again redis-py's general way
_CLUSTER_CHANGING = (
    redis_py.exceptions.MovedError,
    redis_py.exceptions.AskError,
    redis_py.exceptions.TryAgainError,
    redis_py.exceptions.ClusterDownError,
    redis_py.exceptions.SlotNotCoveredError,
    redis_py.exceptions.ConnectionError,
    redis_py.exceptions.TimeoutError,
    redis_py.exceptions.RedisClusterException,
)


def _pack_call(
    command: bytes, name: str, keys: Sequence[str], args: Sequence[str | int | float]
) -> bytes:
    """``EVALSHA sha numkeys keys... args...`` (or ``FCALL function numkeys ...``) as one RESP
    request.

    The scripts take only text and numbers, encoded as redis-py would (UTF-8; the ``repr`` of a
    number) — without its per-argument type dispatch, which on the single-lock fast path cost
    more than building the bytes.
    """
    parts = [key.encode() for key in keys]
    for arg in args:
        if isinstance(arg, str):
            parts.append(arg.encode())
        elif isinstance(arg, bool):  # ambiguous (1/0 or "True"?): refused, as redis-py does
            raise TypeError(f"script arguments are text or numbers, not {arg!r}")
        else:
            parts.append(repr(arg).encode())
    count = b"%d" % len(keys)
    head = b"*%d\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(parts) + 3,
        len(command),
        command,
        len(name),
        name.encode(),
        len(count),
        count,
    )
    return head + b"".join([b"$%d\r\n%s\r\n" % (len(part), part) for part in parts])


_scripts_by_client: weakref.WeakKeyDictionary[Any, Scripts] = weakref.WeakKeyDictionary()


def scripts_for(client: Any) -> Scripts:
    """The (cached) script registry of ``client``."""
    scripts = _scripts_by_client.get(client)
    if scripts is None:
        scripts = Scripts(client)
        _scripts_by_client[client] = scripts
    return scripts


@lru_cache(maxsize=1024)
def holder_json(holder: claim_types.Holder) -> str:
    """A holder as the scripts' ``holder json`` argument (attribution of every hold)."""
    fields = {
        "owner": holder.owner,
        "execution": holder.execution_id,
        "step": holder.step,
        "reactor": holder.reactor,
        "priority": holder.priority or None,
    }
    return json.dumps({k: v for k, v in fields.items() if v is not None})


def _forget_scripts_after_fork() -> None:
    """A forked child registers its scripts on its own clients (see ``coordination.redis``)."""
    _scripts_by_client.clear()


def _prepare_before_fork() -> None:
    """Assemble the sources and the Functions library in the process that forks, once.

    Both are cached per process (``script_sources``, ``function_library.library``), but a
    process that forks its workers before any coordination (a Celery prefork parent, a
    ``multiprocessing`` pool) has not built them, so every child read the ``lua/`` files and
    spliced them again before its first admission: 20-30 ms of CPU per child on the 2-core
    benchmark machine (docs/benchmarks.md, "Step-level versus reactor-level lock"), on the way
    to the first critical section. Built here, the children inherit them. A failure is left
    to the child's first use, which raises where the caller can see it."""
    try:
        script_sources()
        function_library.library()
    except Exception:  # pragma: no cover - reported by the first use in the child
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_prepare_before_fork)
forks.after_in_child(_forget_scripts_after_fork)
