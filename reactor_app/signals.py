"""Django signals for every engine and coordination event.

Each member of ``EngineEvent`` and ``CoordinationEventKind`` has a signal of the same name
(``signals.step_started``, ``signals.acquired``...). Two catch-all signals, ``engine_event`` and
``coordination_event``, are also sent for every event with ``kind=`` so one receiver can watch
them all. Receivers get keyword arguments only; see ``reactor_app.tracking`` for the payloads.
"""

from __future__ import annotations

from django.dispatch import Signal

from reactor_app.status import CoordinationEventKind, EngineEvent

engine_event = Signal()
coordination_event = Signal()

ENGINE_SIGNALS: dict[str, Signal] = {kind.value: Signal() for kind in EngineEvent}
COORDINATION_SIGNALS: dict[str, Signal] = {kind.value: Signal() for kind in CoordinationEventKind}

globals().update(ENGINE_SIGNALS)
globals().update(COORDINATION_SIGNALS)


def signal_for(kind: str) -> Signal:
    """The dedicated signal of one event kind."""
    return ENGINE_SIGNALS.get(kind) or COORDINATION_SIGNALS[kind]
