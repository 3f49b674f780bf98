"""Connections that threads keep between script calls, taken from a redis-py pool once.

``coordination.scripts`` sends every admission and release straight to a pooled connection
(``Scripts._send_once``); this module is where a thread's own connection comes from, and how
the pool gets it back after the thread ended. Apart from the scripts because it is a piece of
its own — the pool's bookkeeping redone for one calling pattern — with its own rules (which
pools allow it, how many connections, when an idle one is checked, what a fork does).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

import redis as redis_py

from reactor_app import forks


class KeptConnections:
    """The connections threads keep of one pool: up to half of its ``max_connections``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._allowance = _Allowance(getattr(pool, "max_connections", 0) // 2)
        self._pinned = threading.local()

    def get(self) -> Any:
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
        if pinned is None or pinned.pid != forks.pid():
            _give_back_ended()
            if not self._allowance.take():
                return None
            try:
                pinned = _Pinned(self.pool, self._allowance)
            except BaseException:
                self._allowance.give_back()
                raise
            self._pinned.entry = pinned
        connection = pinned.connection
        now = time.monotonic()
        try:
            if connection._sock is not None and (
                not self.pool.owns_connection(connection)
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
        self.pid = forks.pid()
        self.used = time.monotonic()

    def __del__(self) -> None:
        try:
            # (no pid: __init__ failed; another pid: a fork's copy, whose socket is the parent's)
            if getattr(self, "pid", None) == forks.pid():
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


def _forget_after_fork() -> None:
    """A forked child gives back none of the connections its parent's ended threads kept."""
    _ended.clear()


forks.after_in_child(_forget_after_fork)
