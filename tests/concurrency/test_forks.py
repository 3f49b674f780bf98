"""A forked child never uses the per-process state it inherited (``reactor_app.forks``).

The tracking writer, the renewal scheduler and a thread's kept Redis connection each check on
use that they were made in the calling process, by its id. That id is ``forks.pid()``, kept by
an ``os.register_at_fork`` hook rather than asked of the system on every call. Here a parent
uses each of them, then forks real children the way a prefork pool does (``multiprocessing``'s
fork context, as billiard forks Celery's), and each child checks that the id it reads is its
own and that each piece it is handed is its own, not its parent's copy — a writer whose
thread never runs there, a scheduler without a thread, a socket the parent still talks on.

A uWSGI worker is forked by ``fork(2)`` alone unless ``py-call-osafterfork`` is set: no
at-fork hook runs in it, only uWSGI's own post-fork hook. The same kind of child is made here
with ``fork(2)`` through ``ctypes``, once left alone (it hands out its parent's next
``Step.call`` owner and request id: the hazard) and once running the post-fork hook
``forks`` chained onto a stand-in ``uwsgi`` module. A real uWSGI 2.0.31 worker behaved as the
first before the change and as the second after it (docs/operations.md, "Forking servers").
"""

from __future__ import annotations

import ctypes
import importlib
import json
import multiprocessing
import os
import sys
import types
from typing import Any

import pytest

from reactor_app import forks
from reactor_app.coordination.redis import get_client
from reactor_app.coordination.renewal import scheduler
from reactor_app.coordination.scripts import scripts_for
from reactor_app.coordination.stored_replies import new_request_id
from reactor_app.engine.gate import fresh_owner
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


def _bare_fork_report(run_uwsgi_hook: bool) -> dict[str, Any]:
    """Fork with fork(2) itself, as uWSGI forks its workers: Python's at-fork hooks do not run
    in the child. The child calls uWSGI's post-fork hook first when ``run_uwsgi_hook``, as a
    uWSGI worker does, then reports what it reads; the parent returns that with the owner and
    request id its own generators hand out next."""
    read_end, write_end = os.pipe()
    child = ctypes.PyDLL(None).fork()  # PyDLL: the call keeps the GIL, so the child has it
    if child == 0:
        try:
            os.close(read_end)
            if run_uwsgi_hook:
                sys.modules["uwsgi"].post_fork_hook()
            report = {
                "os": os.getpid(),
                "forks": forks.pid(),
                "owner": fresh_owner(),
                "request": new_request_id(),
                "writer": get_writer()._pid,
                "scheduler": scheduler().pid,
            }
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reading:
        report = json.loads(reading.read() or b"{}")
    os.waitpid(child, 0)
    report["parent's next owner"] = fresh_owner()
    report["parent's next request"] = new_request_id()
    return report


def test_a_uwsgi_worker_runs_the_childs_resets_from_uwsgis_own_post_fork_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uWSGI without ``py-call-osafterfork`` forks its workers without Python's at-fork hooks
    (checked by hand with uWSGI 2.0.31: the hooks did not run, its ``uwsgi.post_fork_hook``
    did). Such a child, left alone, hands out its parent's next owner — two workers would walk
    into one lock as re-entries. Inside uWSGI the resets hang on its post-fork hook too."""
    fake_uwsgi = types.ModuleType("uwsgi")
    monkeypatch.setitem(sys.modules, "uwsgi", fake_uwsgi)
    monkeypatch.setitem(sys.modules, "uwsgidecorators", None)  # importing it fails
    forks._join_uwsgi()
    assert callable(fake_uwsgi.post_fork_hook)
    get_writer()  # made in this process, inherited by the children
    scheduler()
    parent = os.getpid()

    left_alone = _bare_fork_report(run_uwsgi_hook=False)
    assert left_alone["forks"] == parent != left_alone["os"], left_alone  # a fork unnoticed
    assert left_alone["owner"] == left_alone["parent's next owner"], left_alone
    assert left_alone["request"] == left_alone["parent's next request"], left_alone

    hooked = _bare_fork_report(run_uwsgi_hook=True)
    own = hooked["os"]
    assert own != parent, hooked
    assert hooked["forks"] == own, hooked
    assert hooked["writer"] == own and hooked["scheduler"] == own, hooked
    assert hooked["owner"] != hooked["parent's next owner"], hooked
    assert hooked["request"].split(".")[0] != hooked["parent's next request"].split(".")[0]


def test_the_uwsgi_hook_runs_the_resets_once_when_pythons_hooks_ran_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``py-call-osafterfork`` a uWSGI worker runs both: Python's at-fork hooks, then
    uWSGI's post-fork hook. The second finds the id already the child's and does nothing;
    a hook uWSGI had before is still called."""
    fake_uwsgi = types.ModuleType("uwsgi")
    earlier: list[int] = []
    fake_uwsgi.post_fork_hook = lambda: earlier.append(os.getpid())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uwsgi", fake_uwsgi)
    monkeypatch.setitem(sys.modules, "uwsgidecorators", None)
    forks._join_uwsgi()
    resets: list[int] = []
    # (a stand-in for the resets: the real ones would drop this process's Redis clients)
    monkeypatch.setattr(forks, "_in_child", [lambda: resets.append(1)])
    forks._forked()  # as Python's at-fork hooks would in a child
    fake_uwsgi.post_fork_hook()
    assert resets == [1]
    assert earlier == [os.getpid()]


def test_a_reset_that_raises_does_not_keep_the_others_from_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("a reset failed")

    monkeypatch.setattr(forks, "_in_child", [broken, lambda: ran.append("after")])
    with pytest.raises(RuntimeError, match="a reset failed"):
        forks._forked()
    assert ran == ["broken", "after"]


#: what importing uWSGI's ``uwsgidecorators`` does to the post-fork hook, and nothing else
STAND_IN_DECORATORS = """
import uwsgi

postfork_chain = []


def postfork_chain_hook():
    for hook in postfork_chain:
        hook()


uwsgi.post_fork_hook = postfork_chain_hook
"""


@pytest.mark.parametrize(
    "when", ["decorators-replace-an-earlier-hook", "hook-set-after-decorators"]
)
def test_the_applications_own_post_fork_hook_still_runs_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, when: str
) -> None:
    """An application's own uWSGI post-fork hook survives the chaining: set before, it is
    replaced by the import of ``uwsgidecorators`` that ``forks`` makes, and goes first in
    that chain; set after that module was imported, it is wrapped."""
    fake_uwsgi = types.ModuleType("uwsgi")
    monkeypatch.setitem(sys.modules, "uwsgi", fake_uwsgi)
    (tmp_path / "uwsgidecorators.py").write_text(STAND_IN_DECORATORS)
    monkeypatch.syspath_prepend(str(tmp_path))
    # importable from tmp_path, and out of sys.modules again after the test
    monkeypatch.setitem(sys.modules, "uwsgidecorators", None)
    monkeypatch.delitem(sys.modules, "uwsgidecorators")
    ran: list[str] = []

    def application_hook() -> None:
        ran.append("application")

    if when == "decorators-replace-an-earlier-hook":
        fake_uwsgi.post_fork_hook = application_hook  # type: ignore[attr-defined]
    else:
        importlib.import_module("uwsgidecorators")
        fake_uwsgi.post_fork_hook = application_hook  # type: ignore[attr-defined]
    forks._join_uwsgi()
    monkeypatch.setattr(forks, "_in_child", [lambda: ran.append("reset")])
    monkeypatch.setattr(forks, "_pid", -1)  # as in a child Python's hooks did not reach
    fake_uwsgi.post_fork_hook()
    assert ran == ["application", "reset"]
    assert forks.pid() == os.getpid()
