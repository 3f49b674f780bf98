"""The engine's own delivery of its signals (``tracking._send`` over ``EventSignal``).

The receivers a send reaches are worked out once per connect/disconnect instead of on every
send; these pin that the result is still what Django's ``send_robust`` would reach: receivers
connected or disconnected after a send was cached, per-sender receivers, weak receivers that
died (never kept alive by the cache, and dropped), coroutine receivers (Django 5 runs those),
and a raising receiver that costs the others nothing and is logged as Django logged it.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import django
import pytest

from reactor_app import signals
from reactor_app.models import CoordinationEvent, Execution
from reactor_app.tracking import _send


@pytest.fixture
def signal() -> signals.EventSignal:
    return signals.EventSignal()


def test_a_receiver_connected_after_a_send_is_reached_by_the_next(
    signal: signals.EventSignal,
) -> None:
    heard: list[str] = []
    _send(signal, CoordinationEvent, {"kind": "acquired"})  # caches "no receiver"

    def first(sender: Any, **payload: Any) -> None:
        heard.append(f"first {payload['kind']}")

    signal.connect(first, weak=False)
    _send(signal, CoordinationEvent, {"kind": "acquired"})

    def second(sender: Any, **payload: Any) -> None:
        heard.append(f"second {payload['kind']}")

    signal.connect(second, weak=False)
    _send(signal, CoordinationEvent, {"kind": "released"})
    signal.disconnect(first)
    _send(signal, CoordinationEvent, {"kind": "extended"})
    assert heard == ["first acquired", "first released", "second released", "second extended"]


def test_a_receiver_for_one_sender_hears_only_that_sender(signal: signals.EventSignal) -> None:
    heard: list[Any] = []

    def receiver(sender: Any, **payload: Any) -> None:
        heard.append(sender)

    signal.connect(receiver, sender=Execution, weak=False)
    _send(signal, CoordinationEvent, {"kind": "acquired"})
    _send(signal, Execution, {"kind": "step_started"})
    _send(signal, CoordinationEvent, {"kind": "released"})
    assert heard == [Execution]


def test_a_weak_receiver_that_died_is_skipped_and_not_kept_alive(
    signal: signals.EventSignal,
) -> None:
    heard: list[str] = []

    class Listener:
        def on_event(self, sender: Any, **payload: Any) -> None:
            heard.append(payload["kind"])

    listener = Listener()
    signal.connect(listener.on_event)  # weak: a bound method of an object only we hold
    _send(signal, CoordinationEvent, {"kind": "acquired"})
    del listener
    gc.collect()
    _send(signal, CoordinationEvent, {"kind": "released"})
    assert heard == ["acquired"]
    assert signal.live_receivers(CoordinationEvent) == []
    assert signal.receivers == []  # its entry dropped, as Django's own send drops it


@pytest.mark.skipif(django.VERSION < (5, 0), reason="async receivers came with Django 5.0")
def test_a_coroutine_receiver_is_run_by_djangos_own_send(signal: signals.EventSignal) -> None:
    heard: list[str] = []

    async def receiver(sender: Any, **payload: Any) -> None:
        heard.append(payload["kind"])

    signal.connect(receiver, weak=False)
    assert signal.live_receivers(CoordinationEvent) is None
    _send(signal, CoordinationEvent, {"kind": "acquired"})
    assert heard == ["acquired"]


def test_a_raising_receiver_is_logged_and_the_others_still_hear(
    signal: signals.EventSignal, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[str] = []

    def broken(sender: Any, **payload: Any) -> None:
        raise RuntimeError("receiver bug")

    def working(sender: Any, **payload: Any) -> None:
        heard.append(payload["kind"])

    signal.connect(broken, weak=False)
    signal.connect(working, weak=False)
    with caplog.at_level(logging.ERROR):
        _send(signal, CoordinationEvent, {"kind": "acquired"})
    assert heard == ["acquired"]
    [record] = [r for r in caplog.records if r.name == "reactor_app.tracking"]
    assert "receiver bug" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is not None
    # and what Django's send_robust logs for it, as before the engine delivered its signals
    [django_record] = [r for r in caplog.records if r.name == "django.dispatch"]
    assert "broken" in django_record.getMessage()
    assert "receiver bug" in django_record.getMessage()


def test_the_json_text_of_small_details_is_kept_per_exact_keys_and_values() -> None:
    """The writer's kept JSON text of small details (``tracking_store._json_text``): details
    that compare equal as Python dicts but not as JSON never share an entry."""
    import json

    from reactor_app.tracking_store import _json_text

    cases: list[Any] = [
        {"reentrant": True},
        {"reentrant": 1},
        {"reentrant": 1.0},
        {True: "x"},
        {1: "x"},
        {"outcome": "success"},
        {"outcome": "x" * 500},
        {"nested": [True]},
        [1, 2],
    ]
    for _ in range(2):  # the second round meets whatever was kept
        for value in cases:
            assert _json_text(value) == json.dumps(value)
