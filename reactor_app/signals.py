"""Django signals for every engine and coordination event.

Each member of ``EngineEvent`` and ``CoordinationEventKind`` has a signal of the same name
(``signals.step_started``, ``signals.acquired``...). Two catch-all signals, ``engine_event`` and
``coordination_event``, are also sent for every event with ``kind=`` so one receiver can watch
them all. Receivers get keyword arguments only; see ``reactor_app.tracking`` for the payloads.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.dispatch import Signal, dispatcher

from reactor_app.status import CoordinationEventKind, EngineEvent

_UNKNOWN: Any = object()

#: how Django keys receivers and senders (``id``, or the pair of a bound method's ids); private
#: in Django, and unchanged since its first release
_make_id = dispatcher._make_id  # type: ignore[attr-defined]


class EventSignal(Signal):
    """A plain Django ``Signal`` that also answers, cheaply, which receivers a send reaches.

    Every event of every step goes through two of these, so the engine delivers events itself
    (``tracking._send``) from ``live_receivers``: the list of receivers for one sender is worked
    out once after each ``connect`` / ``disconnect`` instead of on every send (Django's own
    path takes the signal's lock, walks every entry and dereferences each on each send:
    docs/benchmarks.md, "Hot path"). The cache keeps the weak references Django keeps, so it
    never keeps a receiver alive; one that died is skipped (and dropped, as Django drops it,
    on the next send). It is keyed by the sender's id —
    the key Django itself matches senders by — so ``None`` is a sender like any other, and
    ``send`` / ``send_robust`` / ``has_listeners`` are Django's, unchanged.
    """

    def __init__(self) -> None:
        super().__init__()
        #: sender key -> ((receiver or its weak reference, weak?), ...), or None: an async one
        self._by_sender: dict[Any, Any] = {}

    def connect(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().connect(*args, **kwargs)
        finally:
            self._by_sender = {}

    def disconnect(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return super().disconnect(*args, **kwargs)
        finally:
            self._by_sender = {}

    def live_receivers(self, sender: Any) -> list[Any] | None:
        """The receivers a send from ``sender`` reaches now, in connection order — or None when
        one of them is a coroutine function (Django 5 runs those in ``send_robust``; Django 4.2
        has no async receivers and calls every receiver alike, as this list is called)."""
        if self._dead_receivers:  # type: ignore[attr-defined]
            # a weak receiver died: drop its entry, as Django's own send would, so a signal
            # whose receivers are all gone costs its events nothing again
            with self.lock:
                self._clear_dead_receivers()  # type: ignore[attr-defined]
                self._by_sender = {}
        # a class (the engine's senders are model classes) is keyed by its id, as ``_make_id``
        # keys anything that is not a bound method
        key = id(sender) if isinstance(sender, type) or sender is None else _make_id(sender)
        entries = self._by_sender.get(key, _UNKNOWN)
        if entries is _UNKNOWN:
            entries = self._entries_for(key)
        if entries is None:
            return None
        live = []
        for receiver, weak in entries:
            if weak:
                receiver = receiver()
                if receiver is None:
                    continue
            live.append(receiver)
        return live

    def _entries_for(self, key: Any) -> tuple[Any, ...] | None:
        """The entries of the receivers of the sender Django keys ``key`` (cached)."""
        with self.lock:
            found: list[tuple[Any, bool]] = []
            for entry in self.receivers:
                # (lookup key, receiver[, is_async]): Django 5 added the third
                (_, sender_key), receiver = entry[0], entry[1]
                if sender_key != dispatcher.NONE_ID and sender_key != key:
                    continue
                if len(entry) > 2 and entry[2]:
                    found = None  # type: ignore[assignment]
                    break
                found.append((receiver, isinstance(receiver, weakref.ReferenceType)))
            entries = None if found is None else tuple(found)
            self._by_sender[key] = entries
        return entries


engine_event = EventSignal()
coordination_event = EventSignal()

ENGINE_SIGNALS: dict[str, EventSignal] = {kind.value: EventSignal() for kind in EngineEvent}
COORDINATION_SIGNALS: dict[str, EventSignal] = {
    kind.value: EventSignal() for kind in CoordinationEventKind
}

globals().update(ENGINE_SIGNALS)
globals().update(COORDINATION_SIGNALS)


def signal_for(kind: str) -> EventSignal:
    """The dedicated signal of one event kind."""
    return ENGINE_SIGNALS.get(kind) or COORDINATION_SIGNALS[kind]
