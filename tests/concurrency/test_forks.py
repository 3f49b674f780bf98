"""A forked child never uses the per-process state it inherited (``reactor_app.forks``).

The tracking writer, the renewal scheduler and a thread's kept Redis connection each check on
use that they were made in the calling process, by its id. That id is ``forks.pid()``, kept by
an ``os.register_at_fork`` hook rather than asked of the system on every call. Here a parent
uses each of them, then forks real children the way a prefork pool does (``multiprocessing``'s
fork context, as billiard forks Celery's), and each child checks that the id it reads is its
own and that each piece it is handed is its own, not its parent's copy — a writer whose
thread never runs there, a scheduler without a thread, a socket the parent still talks on.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from reactor_app import forks
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.renewal import scheduler
from reactor_app.coordination.scripts import scripts_for
from reactor_app.write_behind import get_writer


def kept_connection_pid() -> Any:
    """The process the calling thread's kept Redis connection was taken in (None: threads keep
    none here)."""
    kept = scripts_for(get_client())._kept
    if kept is None or kept.get() is None:
        return None
    return kept._pinned.entry.pid


def in_child(_: int) -> dict[str, Any]:
    return {
        "os": os.getpid(),
        "forks": forks.pid(),
        "writer": get_writer()._pid,
        "scheduler": scheduler().pid,
        "kept connection": kept_connection_pid(),
    }


def test_a_forked_child_reads_its_own_id_and_uses_none_of_its_parents_state() -> None:
    parent = os.getpid()
    assert forks.pid() == parent
    # the parent uses each piece first, so each child inherits it
    assert get_writer()._pid == parent
    assert scheduler().pid == parent
    assert kept_connection_pid() == parent  # (the suite's Redis is one server: threads keep one)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        seen = pool.map(in_child, range(4))
    children = {child["os"] for child in seen}
    assert parent not in children
    for child in seen:
        own = child["os"]
        assert child["forks"] == own, child
        assert child["writer"] == own, child
        assert child["scheduler"] == own, child
        assert child["kept connection"] == own, child
