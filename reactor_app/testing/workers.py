"""Real Celery worker processes, started and stopped from Python.

``WorkerProcess`` runs ``python -m celery -A <app> worker`` as a subprocess in its own process
group, waits until the worker logs that it is ready, and stops it with a warm shutdown
(``SIGTERM``), killing the whole group if it lingers. The pytest plugin's
``celery_worker_process`` fixture and ``manage.py demo_step_lock`` both use it, so there is one
way to start a worker and one way to stop it.

Coordination claims are concurrency claims: they are proved against real worker processes,
never against Celery's eager mode, which would run a task inside the caller's own frame (and
re-enter a lock the caller already holds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from kombu import Exchange, Queue

from reactor_app.tasks import run_execution

#: seconds a worker gets to log "ready" before ``start`` gives up
START_TIMEOUT = 60.0
#: seconds a warm shutdown may take before the process group is killed
STOP_TIMEOUT = 15.0
#: what a Celery worker logs once it consumes
READY_MARK = " ready."
#: the settings module ``settings_environment`` points workers at
WORKER_SETTINGS_MODULE = "reactor_app.testing.worker_settings"


class WorkerStartError(RuntimeError):
    """The worker exited or did not become ready in time; the message ends with its log."""


class WorkerProcess:
    """One ``celery -A <app> worker`` subprocess (a prefork parent and its children).

    ``env`` is the child's whole environment (default: this process's), ``cwd`` its working
    folder (default: the current one — the app must be importable from there), ``log_path``
    where its output goes (default: a temporary file, deleted by ``stop`` unless
    ``keep_log``).
    """

    def __init__(
        self,
        app: str,
        *,
        queues: Sequence[str] = ("reactor",),
        concurrency: int = 2,
        pool: str = "prefork",
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        loglevel: str = "INFO",
        keep_log: bool = False,
    ) -> None:
        self.app = app
        self.queues = tuple(queues)
        self.concurrency = concurrency
        self.pool = pool
        self.name = name or f"{self.queues[0]}-{os.getpid()}-{id(self):x}"
        self.env = dict(os.environ if env is None else env)
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self.loglevel = loglevel
        self.keep_log = keep_log
        self.process: subprocess.Popen[bytes] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line (``-Q`` queues, ``-n`` a node name unique to this worker)."""
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            # no broadcast chatter between workers: start-up stays fast and independent
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            ",".join(self.queues),
            "-n",
            f"{self.name}@%h",
            "--loglevel",
            self.loglevel,
        ]

    def start(self, timeout: float = START_TIMEOUT) -> WorkerProcess:
        """Start the worker and block until it is ready; ``WorkerStartError`` otherwise."""
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> WorkerProcess:
        """Start the process without waiting (start several, then ``wait_ready`` each)."""
        if self.process is not None:
            raise RuntimeError(f"worker {self.name} was already started")
        if self.log_path is None:
            handle, path = tempfile.mkstemp(prefix=f"celery-{self.name}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # its own process group: stop() can reach the prefork children, and a Ctrl-C
                # in the caller's terminal does not hit the worker before stop() does
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> WorkerProcess:
        """Block until the spawned worker logs that it is ready; ``WorkerStartError`` (and the
        worker stopped) if it exits or takes longer than ``timeout`` seconds."""
        if self.process is None:
            raise RuntimeError(f"worker {self.name} was not started")
        deadline = time.monotonic() + timeout
        while READY_MARK not in self.read_log():
            if not self.alive():
                log = self.log()
                code = self.stop()
                raise WorkerStartError(
                    f"the celery worker {self.name} exited with code {code}:\n{log}"
                )
            if time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise WorkerStartError(
                    f"the celery worker {self.name} was not ready after {timeout:.0f}s:\n{log}"
                )
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """Warm shutdown, then SIGKILL to the whole group if it lingers. Returns the exit code."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        if process is not None:
            # a prefork child orphaned by a killed parent would keep consuming: reap the group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._own_log and not self.keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        return process.returncode if process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- output ---------------------------------------------------------------------------

    def read_log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log(self, tail: int = 80) -> str:
        """The last ``tail`` lines of the worker's output."""
        return "\n".join(self.read_log().splitlines()[-tail:])

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> WorkerProcess:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else "stopped"
        return f"<WorkerProcess {self.name} -A {self.app} -Q {','.join(self.queues)} {state}>"


def settings_environment(
    overrides: Mapping[str, Any],
    *,
    base_settings: str | None = None,
    databases: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a worker whose Django settings are the project's plus ``overrides``.

    The worker's ``DJANGO_SETTINGS_MODULE`` becomes ``reactor_app.testing.worker_settings``,
    which imports ``base_settings`` (default: this process's ``DJANGO_SETTINGS_MODULE``), then
    applies ``overrides`` (JSON-able values) and points each database alias of ``databases``
    at that database name. Use it when the worker must share settings with this process that
    the project's settings module does not read from the environment (a queue, a key prefix,
    a test database).
    """
    result = dict(os.environ if env is None else env)
    base = (
        base_settings
        or result.get("DJANGO_SETTINGS_MODULE")
        or os.environ.get("DJANGO_SETTINGS_MODULE")
    )
    if not base or base == WORKER_SETTINGS_MODULE:
        base = result.get("REACTOR_TEST_BASE_SETTINGS") or base
    if not base:
        raise RuntimeError("settings_environment needs the project's settings module")
    result["REACTOR_TEST_BASE_SETTINGS"] = base
    result["DJANGO_SETTINGS_MODULE"] = WORKER_SETTINGS_MODULE
    result["REACTOR_TEST_SETTINGS"] = json.dumps(dict(overrides))
    result["REACTOR_TEST_DATABASES"] = json.dumps(dict(databases or {}))
    return result


def delete_broker_queue(queue: str) -> bool:
    """Remove ``queue`` (its messages and its binding) from the Celery broker of
    ``reactor_app``'s tasks — for the private queues of workers started here. Best effort:
    returns False when the broker could not be reached."""
    try:
        with run_execution.app.connection_for_write() as broker:
            # declared first: a channel only deletes the bindings it knows of
            bound = Queue(queue, Exchange(queue), routing_key=queue)(broker.default_channel)
            bound.declare()
            bound.delete()
            # on RabbitMQ the exchange Celery declared for the queue outlives it: ours, so gone
            bound.exchange.delete()
    except Exception:  # a leftover empty queue harms nobody
        return False
    return True
