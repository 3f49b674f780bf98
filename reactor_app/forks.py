"""Forked children: this process's id without a system call, and the resets a child runs.

**The id.** Per-process state — the tracking writer, the renewal scheduler, the connections
threads keep, the claim renewer, the sweeper's timer, the kept pub/sub subscription — checks
on each use that it was made in this process and not inherited through a fork (Celery's
prefork pool forks its children from a parent that may have used them): it compares the pid
it was made in with the current one. ``os.getpid()`` is a system call each time (glibc no
longer caches it), and a locked ``Step.call`` asked five times: five of its thirteen system
calls, on a host where the calls around a round trip are a good part of a call's cost
(docs/benchmarks.md, "The process id without a system call"). ``pid()`` answers from a global
set again in every child.

**The resets.** What a child must not share with its parent is reset in the child by the
hooks registered here (``after_in_child``): the generators of ``Step.call`` owners and of
request ids (two processes handing out one owner would both walk into one lock as
re-entries), the Redis clients and their connections, the scripts' registries, the live
limits' copy. They run after every fork that runs Python's at-fork hooks: ``os.fork`` and
``os.forkpty`` (which ``multiprocessing``, gunicorn and billiard, Celery's pool, call), and C
code that forks through ``PyOS_AfterFork_Child`` as the C API asks.

**uWSGI** forks its workers from a master that loaded the application, and runs Python's
at-fork hooks in them only with ``py-call-osafterfork``: without it, every worker would hand
out its master's sequence of owners. Its own post-fork hook (``uwsgi.post_fork_hook``) runs in
every worker either way, so inside uWSGI the resets are chained onto it too (``_join_uwsgi``),
and run there unless Python's hooks already did (docs/operations.md, "Forking servers").
``subprocess`` replaces its child with another program, which reads nothing here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

_pid = os.getpid()

#: what a forked child runs, in the order registered (after ``_pid`` is the child's own)
_in_child: list[Callable[[], None]] = []


def pid() -> int:
    """This process's id (``os.getpid()``), without the system call."""
    return _pid


def after_in_child(hook: Callable[[], None]) -> None:
    """Run ``hook`` in every forked child of this process, before the child uses anything the
    package keeps per process. Registered at import by the modules that keep such state."""
    _in_child.append(hook)


def _forked() -> None:
    """The child's side of a fork: its own id, then every reset — all of them even when one
    raises, as separate at-fork hooks would each run (the first error is raised after)."""
    global _pid
    _pid = os.getpid()
    failed: BaseException | None = None
    for hook in _in_child:
        try:
            hook()
        except Exception as error:
            failed = failed or error
    if failed is not None:
        raise failed


def _after_uwsgi_fork() -> None:
    """uWSGI's post-fork hook: the resets, unless Python's at-fork hooks ran them already
    (``py-call-osafterfork``), which left ``_pid`` the child's."""
    if _pid != os.getpid():
        _forked()


def _join_uwsgi() -> None:
    """Inside a uWSGI server, chain ``_after_uwsgi_fork`` onto its post-fork hook. Outside one,
    nothing: ``uwsgi`` is a module only a uWSGI server provides.

    Through ``uwsgidecorators``' chain when that module can be imported (it comes with uWSGI's
    package) and its chain is the hook: importing it sets ``uwsgi.post_fork_hook`` to the
    chain, so a hook set directly would be lost if the application imported it later. A hook
    the application had set before, which that import replaces, goes first in the chain.
    Importing it also sets ``uwsgi.spooler`` to its dispatcher, which an application assigning
    its own spooler function after start-up overrides as before. Otherwise (no such module, or
    a hook the application set after importing it) the hook in place is wrapped: it runs
    first, then the resets."""
    uwsgi: Any = sys.modules.get("uwsgi")
    if uwsgi is None:
        try:
            import uwsgi  # type: ignore[import-not-found, no-redef]  # only inside uWSGI
        except ImportError:
            return
    earlier = getattr(uwsgi, "post_fork_hook", None)
    try:
        import uwsgidecorators  # type: ignore[import-not-found]  # comes with uWSGI
    except ImportError:
        uwsgidecorators = None
    chain = getattr(uwsgidecorators, "postfork_chain", None)
    chain_hook = getattr(uwsgidecorators, "postfork_chain_hook", None)
    current = getattr(uwsgi, "post_fork_hook", None)
    if isinstance(chain, list) and chain_hook is not None and current is chain_hook:
        if earlier is not None and earlier is not chain_hook:
            chain.insert(0, earlier)  # the application's hook, which the import replaced
        chain.append(_after_uwsgi_fork)
        return

    def post_fork() -> None:
        if current is not None:
            current()
        _after_uwsgi_fork()

    uwsgi.post_fork_hook = post_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
_join_uwsgi()
