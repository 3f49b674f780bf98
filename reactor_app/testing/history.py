"""Recorded histories of coordination operations, for the linearizability checker.

A lock service is checked the way Jepsen and etcd's robustness suite check one: every client
operation records when it was *invoked* and how it *completed* — ``ok`` (it happened, with the
values it saw), ``fail`` (it certainly did not happen) or ``info`` (the outcome is unknown: a
timeout, a lost connection, a process killed mid-call). ``reactor_app.testing.linearizability``
then decides whether one legal sequential order explains the whole history.

Times are ``time.monotonic_ns()``: on Linux that is ``CLOCK_MONOTONIC``, one clock for every
process of the machine, so events recorded by threads, forked children and worker processes
are comparable after a merge. Wall-clock time could step backwards and reorder them.

Recording is thread-safe (one lock around the in-memory list) and process-safe: with a
``path`` every event is also appended to a JSON-lines file as one ``write`` on a file opened
``O_APPEND``, so lines of concurrent processes never interleave; ``load`` reads any number of
such files back and ``operations`` pairs each invocation with its completion. An invocation
that never completed (its process was killed) becomes ``info``: it may or may not have taken
effect, and stays open until the end of the history.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

EventType = Literal["invoke", "ok", "fail", "info"]
COMPLETIONS: tuple[str, ...] = ("ok", "fail", "info")

#: the process name of fault injectors (a Redis restarted empty, a failover): their operations
#: concern every key of the history
NEMESIS = "nemesis"
#: the operation of a ``testing.clock_watch.ClockWatch``: how far the server's clock stepped
#: ahead of this machine's monotonic clock while the history was recorded
CLOCK = "clock"


@dataclass(frozen=True)
class Event:
    """One line of a history: an invocation or the completion of operation ``op``."""

    op: str  # the operation's id, shared by its invocation and its completion
    type: EventType
    process: str
    f: str  # the operation: "acquire", "release", "write", "lose"...
    key: str | None  # what it concerns (None: every key, a nemesis's fault)
    time: int  # time.monotonic_ns()
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "op": self.op,
                "type": self.type,
                "process": self.process,
                "f": self.f,
                "key": self.key,
                "time": self.time,
                "value": self.value,
            },
            separators=(",", ":"),
            default=str,
        )

    @classmethod
    def from_json(cls, line: str) -> Event:
        data = json.loads(line)
        if data.get("type") not in ("invoke", *COMPLETIONS):
            raise ValueError(f"not a history event (type {data.get('type')!r}): {line[:200]}")
        return cls(
            op=str(data["op"]),
            type=data["type"],
            process=str(data["process"]),
            f=str(data["f"]),
            key=data.get("key"),
            time=int(data["time"]),
            value=dict(data.get("value") or {}),
        )


@dataclass(frozen=True)
class Operation:
    """An invocation paired with its completion.

    ``call`` and ``ret`` are monotonic nanoseconds; ``ret`` is ``None`` for an ``info``
    operation (its effect, if any, may land at any time after ``call``). ``value`` is the
    invocation's value updated with the completion's (what the client asked and what it saw).
    """

    id: str
    process: str
    f: str
    key: str | None
    status: Literal["ok", "fail", "info"]
    call: int
    ret: int | None
    value: dict[str, Any]

    def describe(self, origin: int = 0) -> str:
        end = "open" if self.ret is None else f"{(self.ret - origin) / 1e6:.3f}ms"
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.value.items()))
        return (
            f"[{(self.call - origin) / 1e6:.3f}ms .. {end}] {self.process} {self.f} "
            f"{self.status}({shown})"
        )


class Completion:
    """The open operation ``History.invoke`` answers: complete it once with ``ok``, ``fail``
    or ``info``; later completions are ignored (the first outcome seen is the true one)."""

    def __init__(self, history: History, op: str, process: str, f: str, key: str | None):
        self._history = history
        self.op, self.process, self.f, self.key = op, process, f, key
        self.done = False

    def _complete(self, kind: EventType, value: dict[str, Any]) -> None:
        if self.done:
            return
        self.done = True
        self._history._append(
            Event(self.op, kind, self.process, self.f, self.key, time.monotonic_ns(), value)
        )

    def ok(self, **value: Any) -> None:
        """It happened; ``value`` is what the client saw (token, slot, admitted...)."""
        self._complete("ok", value)

    def fail(self, **value: Any) -> None:
        """It certainly did not happen (the server answered with a refusal to act)."""
        self._complete("fail", value)

    def info(self, **value: Any) -> None:
        """The outcome is unknown: the reply was lost, the call timed out."""
        self._complete("info", value)


class History:
    """A recorder of events, safe across threads; across processes with ``path``.

    ``path``: a JSON-lines file every event is appended to (one ``write`` per line on an
    ``O_APPEND`` descriptor, so concurrent processes never interleave within a line). Forked
    children may keep using the parent's recorder: their events reach the file; the parent's
    in-memory list only has its own, so read a shared history back with ``load(path)``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stem = uuid.uuid4().hex[:8]

    def _next_id(self) -> str:
        # pid in the id: a forked child keeps the parent's counter and stem
        return f"{self._stem}-{os.getpid()}-{next(self._ids)}"

    def _append(self, event: Event) -> None:
        line = (event.to_json() + "\n").encode()
        with self._lock:
            self._events.append(event)
            if self.path is not None:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(descriptor, line)
                finally:
                    os.close(descriptor)

    def invoke(self, process: str, f: str, key: str | None, **value: Any) -> Completion:
        """Record the invocation of ``f`` on ``key`` by ``process``; complete the answer."""
        op = self._next_id()
        self._append(Event(op, "invoke", process, f, key, time.monotonic_ns(), value))
        return Completion(self, op, process, f, key)

    @contextlib.contextmanager
    def operation(
        self, process: str, f: str, key: str | None, **value: Any
    ) -> Iterator[Completion]:
        """``invoke`` for a ``with`` block: an exception that escapes before the block
        completed the operation records it as ``info`` (outcome unknown) and propagates."""
        completion = self.invoke(process, f, key, **value)
        try:
            yield completion
        except BaseException as error:
            completion.info(error=f"{type(error).__name__}: {error}"[:300])
            raise
        if not completion.done:
            completion.info(error="completed without an outcome")

    def nemesis(self, f: str, **value: Any) -> Completion:
        """A fault that concerns every key (``lose``: state may have been lost): invoke it
        before the fault starts and complete it ``ok`` once it is over."""
        return self.invoke(NEMESIS, f, None, **value)

    def events(self) -> list[Event]:
        """This recorder's events (this process's), in recording order."""
        with self._lock:
            return list(self._events)


def load(*paths: str | os.PathLike[str]) -> list[Event]:
    """The events of JSON-lines history files, merged in time order. A torn last line (a
    process killed mid-write) is skipped; any other unreadable line raises ``ValueError``."""
    events: list[Event] = []
    for path in paths:
        if not Path(path).exists():
            continue
        lines = Path(path).read_text().splitlines()
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.append(Event.from_json(line))
            except (ValueError, KeyError, TypeError):
                if number == len(lines) - 1:
                    continue  # torn by a kill
                raise
    events.sort(key=lambda event: event.time)
    return events


def operations(events: Iterable[Event]) -> list[Operation]:
    """Pair invocations with completions; an invocation without one is ``info`` (open).

    Raises ``ValueError`` for a completion without an invocation or a second invocation of
    one id: the history is corrupt and no verdict on it could be trusted.
    """
    invoked: dict[str, Event] = {}
    completed: dict[str, Event] = {}
    for event in events:
        if event.type == "invoke":
            if event.op in invoked:
                raise ValueError(f"operation {event.op} invoked twice")
            invoked[event.op] = event
        elif event.op not in completed:
            completed[event.op] = event
    orphans = set(completed) - set(invoked)
    if orphans:
        raise ValueError(f"completions without an invocation: {sorted(orphans)[:5]}")
    result = []
    for op, start in invoked.items():
        end = completed.get(op)
        status: Literal["ok", "fail", "info"] = "info" if end is None else end.type  # type: ignore[assignment]
        if end is not None and end.time < start.time:
            raise ValueError(f"operation {op} completed before it was invoked")
        result.append(
            Operation(
                id=op,
                process=start.process,
                f=start.f,
                key=start.key,
                status=status,
                call=start.time,
                ret=None if status == "info" or end is None else end.time,
                value={**start.value, **(end.value if end is not None else {})},
            )
        )
    result.sort(key=lambda o: o.call)
    return result
