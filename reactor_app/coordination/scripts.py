"""The Lua scripts: loading and calling them.

``Scripts`` registers every operation script (assembled by ``coordination.script_sources``
from the package's ``lua/`` files) on one client. Every script answers
``{status_code, json_payload}``; ``STATUSES`` (``coordination.statuses``, re-exported here for
the modules that read replies) is the one table that says what each code means. A connection
failure of a script call becomes ``CoordinationUnavailable``
(``coordination.redis.unavailable_on_connection_error``); an admission, release or renewal
whose reply was lost is asked again with its request id (``coordination.stored_replies``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import redis as redis_py

from reactor_app.coordination import claims as claim_types
from reactor_app.coordination.redis import unavailable_on_connection_error
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
    retrying,
    with_request,
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
        #: the pool ``call`` takes connections from directly: a plain one-server client's
        #: (a cluster client routes by slot; a single-connection client has no pool to use)
        self._direct_pool: Any = None
        if isinstance(client, redis_py.Redis) and getattr(client, "connection", None) is None:
            self._direct_pool = client.connection_pool
        #: whether threads keep a connection of that pool between calls (``_connection``), up
        #: to half of its ``max_connections``; else (or past that) one is taken per call
        self._keeps = self._direct_pool is not None and can_keep_connections(self._direct_pool)
        self._allowance = _Allowance(
            getattr(self._direct_pool, "max_connections", 0) // 2 if self._keeps else 0
        )
        self._pinned = threading.local()

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
        script = self._scripts[operation]
        if operation in RETRY_SAFE:
            keys, args = with_request(keys, args)
            return retrying(lambda: self._send(script, keys, args))
        try:
            return self._send(script, keys, args)
        except NotSent as not_sent:
            raise not_sent.cause from None

    def _send(self, script: Any, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """One send of a script call; ``NotSent`` when no connection could be had (nothing
        was sent).

        On a one-server client the command goes straight to a pooled connection — the calling
        thread's own (``_connection``), or one taken for the call: redis-py's generic command
        path (retry wrapper, event dispatch, metrics hooks, option filtering) costs about as
        much Python time as the round trip itself, and every admission and release is a script
        call (docs/benchmarks.md, "Hot path"). What that path does that matters here is kept:
        a connection whose reply was not read whole is disconnected (its next command
        reconnects), and a script the server no longer has (restarted, flushed) is loaded
        again through ``Script``.
        """
        pool = self._direct_pool
        if pool is None:
            return script(keys=keys, args=args)
        try:
            kept = self._connection() if self._keeps else None
            per_call = kept is None
            connection: Any = pool.get_connection() if per_call else kept
        except UNKNOWN_OUTCOME as exc:
            raise NotSent(exc) from exc
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
            if per_call:
                pool.release(connection)
        return script(keys=keys, args=args)

    def _connection(self) -> Any:
        """This thread's connection for ``call``, taken from the pool once and kept — or None
        when threads already keep half of the pool's ``max_connections`` (the rest stays for
        per-call use and the client's other commands; ``_Allowance``).

        Taking a connection from redis-py's pool and giving it back costs two lock rounds, a
        non-blocking read to check it holds no stray reply, and metrics hooks: ~14 µs per
        script call on the benchmark host, 5 to 8% of a locked ``Step.call``
        (docs/benchmarks.md, "A connection per thread"). What the checkout does for a
        connection is done here instead:

        * a connection the pool no longer owns is dropped — under Sentinel, one connected to a
          master that is not the current one any more (another thread's reconnect found the
          new one);
        * a connection unused for ``IDLE_CHECK_AFTER`` gets the same non-blocking read: one the
          server closed meanwhile (a restart, an idle timeout), or one holding a stray reply,
          is dropped, so the call reconnects instead of failing;
        * a dropped connection reconnects through ``connect()``, which for a Sentinel-managed
          connection asks the sentinels for the master (a command sent on a disconnected
          redis-py connection would redial the address it had);
        * anything raised meanwhile — an interrupt in the middle of the handshake included —
          leaves it disconnected, never half-connected with a reply nobody read.

        The pool still owns it: a ``disconnect()`` of the pool disconnects it too. It goes back
        to the pool after the thread has ended, when another thread next asks for one
        (``_Pinned``). A forked child never uses its parent's: the pid is checked.
        """
        pinned = getattr(self._pinned, "entry", None)
        if pinned is None or pinned.pid != os.getpid():
            _give_back_ended()
            if not self._allowance.take():
                return None
            try:
                pinned = _Pinned(self._direct_pool, self._allowance)
            except BaseException:
                self._allowance.give_back()
                raise
            self._pinned.entry = pinned
        connection = pinned.connection
        now = time.monotonic()
        try:
            if connection._sock is not None and (
                not self._direct_pool.owns_connection(connection)
                or (now - pinned.used > IDLE_CHECK_AFTER and _stale(connection))
            ):
                connection.disconnect()
            if connection._sock is None:
                connection.connect()
        except BaseException:
            connection.disconnect()
            raise
        pinned.used = now
        return connection

    def queue(
        self, pipeline: Any, operation: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> None:
        """Queue ``operation`` on a pipeline of this client; decode its answer with
        ``decode_reply``."""
        if operation in RETRY_SAFE:
            keys, args = with_request(keys, args)
        self._scripts[operation](keys=keys, args=args, client=pipeline)


class _Pinned:
    """One thread's connection, taken from ``pool`` on one unit of ``allowance``; given back
    (with the unit) after the thread ends — its ``threading.local`` entry, the only reference,
    is dropped then.

    Given back *later*: ``__del__`` may run wherever the collector runs, even in a thread
    holding the pool's lock (a plain lock: taking it there would deadlock), so it only queues
    the connection, and the next thread to ask for one gives the queue back first
    (``_give_back_ended``).
    """

    __slots__ = ("allowance", "connection", "pid", "pool", "used")

    def __init__(self, pool: Any, allowance: _Allowance) -> None:
        self.connection = pool.get_connection()  # checked by the pool; may raise
        self.pool = pool
        self.allowance = allowance
        self.pid = os.getpid()
        self.used = time.monotonic()

    def __del__(self) -> None:
        try:
            # (no pid: __init__ failed; another pid: a fork's copy, whose socket is the parent's)
            if getattr(self, "pid", None) == os.getpid():
                _ended.append((self.pool, self.connection, self.allowance))
        except (AttributeError, TypeError):
            # the interpreter is shutting down and has cleared this module's globals (the
            # main thread's entry goes last): no pool needs its connection back any more
            pass


class _Allowance:
    """How many more connections of one pool threads may keep."""

    __slots__ = ("left", "lock")

    def __init__(self, size: int) -> None:
        self.left = size
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.left += 1


def _give_back_ended() -> None:
    """Give the connections of ended threads back to their pools (``_Pinned.__del__``)."""
    while _ended:
        try:
            pool, connection, allowance = _ended.pop()
        except IndexError:  # another thread took the last one
            return
        with contextlib.suppress(Exception):  # a pool closed meanwhile: nothing to do
            pool.release(connection)
        allowance.give_back()


def _stale(connection: Any) -> bool:
    """Whether ``connection`` holds data before a request was sent: a stray reply, or the
    end of a connection the server closed (which may also raise)."""
    try:
        return bool(connection.can_read())
    except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError, OSError):
        return True


def can_keep_connections(pool: Any) -> bool:
    """Whether threads may keep connections of ``pool`` between script calls.

    Only on RESP2 connections without client-side caching: there the server sends nothing
    unasked, so data waiting on an idle connection means it is stale (``_stale``); RESP3
    connections get push messages (maintenance notifications, cache invalidations), and the
    pool hands out other connections with caching. Not when greenlets share OS threads (gevent
    or eventlet patching sockets but not threads): their calls would interleave on one
    connection. How many: ``_Allowance``, half of the pool's ``max_connections``.
    """
    protocol = getattr(pool, "connection_kwargs", {}).get("protocol") or 2
    if str(protocol) != "2" or getattr(pool, "cache", None) is not None:
        return False
    return not _greenlets_share_threads()


def _greenlets_share_threads() -> bool:
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("socket"):
        return not gevent_monkey.is_module_patched("threading")
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    if eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("socket"):
        return not eventlet_patcher.is_monkey_patched("thread")
    return False


#: seconds a thread's connection may stay unused before its next call checks it first
#: (``_stale``): calls closer together than this are not worth a system call each; a restart
#: or an idle timeout in between is what the check is for, and takes longer
IDLE_CHECK_AFTER = 0.1

#: (pool, connection, allowance) of threads that ended, to give back (``_give_back_ended``)
_ended: list[tuple[Any, Any, _Allowance]] = []


def _pack_evalsha(sha: str, keys: Sequence[str], args: Sequence[str | int | float]) -> bytes:
    """``EVALSHA sha numkeys keys... args...`` as one RESP request.

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
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(parts) + 3,
        len(sha),
        sha.encode(),
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
    """A forked child registers its scripts on its own clients (see ``coordination.redis``)
    and gives back none of the connections its parent's ended threads kept."""
    _scripts_by_client.clear()
    _ended.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_scripts_after_fork)
