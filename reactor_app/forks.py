"""This process's id, read without a system call and kept right across ``os.fork``.

Per-process state — the tracking writer, the renewal scheduler, the connections threads keep,
the claim renewer, the sweeper's timer, the kept pub/sub subscription — checks on each use
that it was made in this process and not inherited through a fork (Celery's prefork pool forks
its children from a parent that may have used them): it compares the pid it was made in with
the current one. ``os.getpid()`` is a system call each time (glibc no longer caches it), and a
locked ``Step.call`` asked five times: five of its thirteen system calls, on a host where the
calls around a round trip are a good part of a call's cost (docs/benchmarks.md, "The process
id without a system call"). ``pid()`` answers from a global that an ``os.register_at_fork``
hook sets again in every child.

Which forks run the hook: CPython's ``os.fork`` and ``os.forkpty``, and a C program or
extension that forks through ``PyOS_BeforeFork``/``PyOS_AfterFork_Child`` as the C API asks —
among them ``multiprocessing``, gunicorn and billiard, Celery's pool. A child made by a bare
``fork(2)`` that then runs Python code would read its parent's id: uWSGI without
``py-call-osafterfork`` is one, and there the other hooks the package relies on (the
``Step.call`` owners' generator, the request ids, the Redis connections) do not run either, so
docs/operations.md ("Forking servers") asks for that option or ``lazy-apps``. ``subprocess``
replaces its child with another program, which reads nothing here.
"""

from __future__ import annotations

import os

_pid = os.getpid()


def pid() -> int:
    """This process's id (``os.getpid()``), without the system call."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
