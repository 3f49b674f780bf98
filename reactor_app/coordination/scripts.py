"""The Lua scripts: loading, calling, and the one table of their status codes.

``Scripts`` registers every ``lua/<operation>.lua`` file of the package (read through
``importlib.resources``, so it works from a wheel or a zip) on one client. Every script answers
``{status_code, json_payload}``; ``STATUSES`` is the one table that says what each code means.
A connection failure of a script call becomes ``CoordinationUnavailable``
(``coordination.redis.unavailable_on_connection_error``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache, lru_cache
from importlib import resources
from typing import Any

import redis as redis_py

from reactor_app.coordination import claims as claim_types
from reactor_app.coordination.redis import unavailable_on_connection_error
from reactor_app.exceptions import (
    CoordinationError,
    LeaseLost,
    LockAcquisitionError,
    OrderedLockWaitError,
    PeriodInFlightError,
    RateLimitExceeded,
    SemaphoreAcquisitionError,
)

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
#: one Lua file per primitive, in sections spliced into the general scripts
PRIMITIVES_FOLDER = "primitives"
_INCLUDE = re.compile(r"^-- @include (\S+\.lua)\s*$", re.MULTILINE)
_PRIMITIVES = re.compile(r"^-- @primitives (\w+)\s*$", re.MULTILINE)
_SECTION = re.compile(r"^-- @section (\w+)\s*$", re.MULTILINE)


def _lua_folder() -> Any:
    return resources.files(LUA_PACKAGE).joinpath(LUA_FOLDER)


def primitive_sections() -> dict[str, dict[str, str]]:
    """``{primitive: {section: text}}`` of every ``lua/primitives/<primitive>.lua``.

    A primitive's Lua is one file of sections (``admit``, ``release``, ``extend``), each spliced
    into the general script that says ``-- @primitives <section>``; what precedes the first
    section is the file's header comment, spliced nowhere.
    """
    folder = _lua_folder().joinpath(PRIMITIVES_FOLDER)
    found: dict[str, dict[str, str]] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".lua"):
            continue
        # [header, name, text, name, text, ...]
        _, *parts = _SECTION.split(entry.read_text(encoding="utf-8"))
        names, texts = parts[0::2], parts[1::2]
        found[entry.name[: -len(".lua")]] = {
            name: text.strip("\n") + "\n" for name, text in zip(names, texts, strict=True)
        }
    return found


@cache
def script_sources() -> dict[str, str]:
    """``{operation: source}`` for every ``lua/<operation>.lua`` of the installed package.

    Files starting with ``_`` are shared fragments, spliced into operations by a
    ``-- @include _name.lua`` line, not operations themselves. A ``-- @primitives <section>``
    line takes that section of every primitive's file (``primitive_sections``), in name order:
    each registers itself in the script's dispatch tables, so no script lists the primitives.
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
    sections = primitive_sections()

    def splice(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise RuntimeError(f"lua include {name!r} not found in {LUA_PACKAGE}/{LUA_FOLDER}")
        return fragments[name]

    def splice_primitives(match: re.Match[str]) -> str:
        section = match.group(1)
        return "\n".join(
            parts[section] for _, parts in sorted(sections.items()) if section in parts
        )

    return {
        name: _PRIMITIVES.sub(splice_primitives, _INCLUDE.sub(splice, text))
        for name, text in sorted(operations.items())
    }


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
        #: each thread's connection from that pool, kept between calls (``_connection``)
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

        On a one-server client the command goes straight to the calling thread's own pooled
        connection (``_connection``): redis-py's generic command path (retry wrapper, event
        dispatch, metrics hooks, option filtering) costs about as much Python time as the round
        trip itself, and every admission and release is a script call (docs/benchmarks.md,
        "Hot path"). What that path does that matters here is kept: a connection whose reply
        was not read whole is disconnected before its next command (which reconnects), and a
        script the server no longer has (restarted, flushed) is loaded again through
        ``Script``.
        """
        script = self._scripts[operation]
        if self._direct_pool is None:
            return script(keys=keys, args=args)
        connection = self._connection()
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
        return script(keys=keys, args=args)

    def _connection(self) -> Any:
        """This thread's connection for ``call``, taken from the pool once and kept.

        Taking a connection from redis-py's pool and giving it back costs two lock rounds, a
        non-blocking read to check it holds no stray reply, and metrics hooks: ~14 µs per
        script call on the benchmark host, 5 to 8% of a locked ``Step.call``
        (docs/benchmarks.md, "A connection per thread"). The pool still owns it: a
        ``disconnect()`` of the pool (tests, a failover) disconnects it too, and its next
        command reconnects. What the checkout's read was for — finding a connection the server
        closed (a restart, an idle timeout) before sending on it — is done here when the
        connection has been unused for ``IDLE_CHECK_AFTER``. It goes back to the pool when the
        thread ends (``_Pinned``), and a forked child never uses its parent's (its pid is
        checked — against the pid kept at fork, not ``os.getpid()``, a system call on every
        call; the child's registry is new anyway, ``_forget_scripts_after_fork``).
        """
        pinned = getattr(self._pinned, "entry", None)
        if pinned is None or pinned.pid != _pid:
            pinned = _Pinned(self._direct_pool)
            self._pinned.entry = pinned
        now = time.monotonic()
        if now - pinned.used > IDLE_CHECK_AFTER:
            pinned.check()
        pinned.used = now
        connection = pinned.connection
        if connection._sock is None:
            # disconnected (a failed call, a pool's disconnect): reconnect through connect(),
            # as the pool's checkout does — a command sent on a disconnected connection
            # reconnects to the address it had, while a Sentinel-managed connection's
            # connect() asks the sentinels for the master again (after a failover, a new one)
            connection.connect()
        return connection

    def queue(
        self, pipeline: Any, operation: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> None:
        """Queue ``operation`` on a pipeline of this client; decode its answer with
        ``decode_reply``."""
        self._scripts[operation](keys=keys, args=args, client=pipeline)


class _Pinned:
    """One thread's connection, taken from ``pool``; given back when the thread ends (its
    ``threading.local`` entry, the only reference, is dropped then).

    Given back *later*: ``__del__`` may run wherever the collector runs, even in a thread
    holding the pool's lock (a plain lock: taking it there would deadlock), so it only queues
    the connection, and the next thread to pin one hands the queue back to its pools first.
    """

    __slots__ = ("connection", "pid", "pool", "used")

    def __init__(self, pool: Any) -> None:
        while _ended:
            try:
                ended_pool, connection = _ended.pop()
            except IndexError:  # another thread took the last one
                break
            with contextlib.suppress(Exception):  # a pool closed meanwhile: nothing to do
                ended_pool.release(connection)
        self.connection = pool.get_connection()  # checked by the pool; may raise
        self.pool = pool
        self.pid = _pid
        self.used = time.monotonic()

    def check(self) -> None:
        """Disconnect the connection if the server closed it or it holds unread data (a
        restart, an idle timeout), so the call reconnects instead of failing — what the pool
        checks at every checkout. A server that cannot be reached fails the call itself."""
        connection = self.connection
        try:
            if connection.can_read():
                connection.disconnect()
        except (redis_py.exceptions.ConnectionError, redis_py.exceptions.TimeoutError, OSError):
            connection.disconnect()

    def __del__(self) -> None:
        if getattr(self, "pid", None) == _pid:  # (none: __init__ failed; a fork's copy
            # holds the parent's socket: left alone)
            _ended.append((self.pool, self.connection))


#: seconds a thread's connection may stay unused before its next call checks it first
#: (``_Pinned.check``): calls closer together than this are not worth a system call each; a
#: restart or an idle timeout in between is what the check is for, and takes longer
IDLE_CHECK_AFTER = 0.1

#: (pool, connection) of threads that ended, for the next ``_Pinned`` to give back
_ended: list[tuple[Any, Any]] = []
#: this process's pid, renewed in a forked child (``_forget_scripts_after_fork``)
_pid = os.getpid()


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


def decode_reply(raw: Any) -> ScriptReply:
    """A script's raw ``{status, json}`` answer as a ``ScriptReply``."""
    status, payload = raw
    if not payload:
        return ScriptReply(Status(int(status)), {})
    data = json.loads(payload)
    # without "{}" in its text a payload has no empty table to turn into a list: the walk
    # over every value (a five-claim admission's reply has dozens) is skipped
    if (b"{}" if isinstance(payload, bytes) else "{}") in payload:
        data = _lists(data)
    return ScriptReply(Status(int(status)), data)


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


def _forget_scripts_after_fork() -> None:
    """A forked child registers its scripts on its own clients (see ``coordination.redis``)
    and never touches a connection its parent pinned (``Scripts._connection``)."""
    global _pid
    _pid = os.getpid()
    _scripts_by_client.clear()
    _ended.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_scripts_after_fork)
