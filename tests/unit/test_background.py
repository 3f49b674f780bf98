"""``BackgroundThread``: a thread is started when none runs — after one ended, or after one was
remembered and never started — and never a second while one runs."""

from __future__ import annotations

import threading

from reactor_app.background import BackgroundThread


def test_a_running_thread_is_not_started_twice_and_an_ended_one_is_replaced() -> None:
    release = threading.Event()
    started: list[threading.Thread] = []

    def target() -> None:
        started.append(threading.current_thread())
        release.wait(10)

    background = BackgroundThread(target, "test-background")
    assert not background.running()
    assert background.ensure()
    assert not background.ensure()  # it runs: no second one
    assert background.running()
    release.set()
    first = background.thread
    assert first is not None
    first.join(10)
    assert not background.running()  # ended (as a thread dying of an error would)
    release.clear()
    assert background.ensure()  # replaced
    assert background.thread is not first
    release.set()
    background.thread.join(10)  # type: ignore[union-attr]
    assert len(started) == 2 and started[0] is not started[1]


def test_a_thread_remembered_but_never_started_is_replaced() -> None:
    """What a soft limit between remembering and starting leaves (test_background_threads.py
    cuts there for real)."""
    ran = threading.Event()
    background = BackgroundThread(ran.set, "test-background")
    background._thread = threading.Thread(target=ran.set)  # remembered, never started
    assert not background.running()
    assert background.ensure()
    assert ran.wait(10)


def test_the_thread_knows_itself() -> None:
    seen: list[bool] = []
    background = BackgroundThread(lambda: seen.append(background.is_current()), "test-background")
    assert not background.is_current()
    background.ensure()
    background.thread.join(10)  # type: ignore[union-attr]
    assert seen == [True]
