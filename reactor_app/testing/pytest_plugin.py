"""pytest plugin of ``reactor_app``: a real Redis, a clean key space per test, real workers.

Enable it in your top-level ``conftest.py``::

    pytest_plugins = ["reactor_app.testing.pytest_plugin"]

Fixtures:

* ``reactor_redis`` (session) — a redis-py client of the coordination Redis: the configured
  ``REACTOR_REDIS_URL`` (for ``"embedded"``, the embedded server, started if nothing answers
  yet). A Redis that does not answer fails the test under ``CI`` and skips it elsewhere.
* ``reactor_key_space`` (function) — a ``REACTOR_KEY_PREFIX`` no other test uses, set for the
  test (through pytest-django's ``settings`` when available); afterwards every key under it,
  and only those, is deleted (``SCAN`` + ``UNLINK``, never ``FLUSHDB``), so tests never see
  each other's holds and a shared Redis is left as it was found. Request it (or mark it
  ``autouse`` in your conftest) in every test that coordinates.
* ``celery_worker_process`` (module) — a real ``celery -A <app> worker`` subprocess using the
  test database, the coordination Redis, a queue of its own and a key prefix of its own; tests
  that request it get that prefix and queue through ``reactor_key_space``. The app is the ini
  option ``reactor_celery_app`` (default: the package of ``DJANGO_SETTINGS_MODULE``). Override
  the module-scoped fixtures ``celery_worker_settings`` (a dict of settings for the worker *and*
  the test, e.g. ``{"REACTOR_CONTENTION_BACKOFF": [0.2, 1.0]}``),
  ``celery_worker_concurrency`` and ``celery_worker_pool`` (``-P``: prefork, threads, solo) to
  tune it. Tests using it need
  ``@pytest.mark.django_db(transaction=True)``: the worker cannot see an open transaction.

* ``reactor_redis_cluster`` (session) — a real 3-master Redis Cluster started for the run
  (``reactor_app.testing.servers``); its ``.url`` is a ``redis+cluster://`` URL for
  ``REACTOR_REDIS_URL``. ``reactor_redis_sentinel`` (function) — a fresh master + replica +
  sentinel set, for tests that fail it over. Without a ``redis-server`` binary both fail under
  ``CI`` and skip elsewhere. Mark such tests ``cluster`` / ``sentinel`` so ``-m "not cluster"``
  deselects them.

Nothing that needs Django's app registry (the models, and so the tracking writer) is imported
at module level: pytest imports plugins before pytest-django has configured Django.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from reactor_app.conf import reactor_settings
from reactor_app.coordination import embedded
from reactor_app.coordination.keys import glob_escape
from reactor_app.coordination.redis import get_client, redis_url
from reactor_app.testing.servers import RedisClusterServers, SentinelServers, ServerBinaryMissing
from reactor_app.testing.workers import WorkerProcess, delete_broker_queue, settings_environment

#: seconds a configured Redis gets to answer PING
PING_TIMEOUT = 5.0

# pid + a random token: two concurrent runs (or xdist workers) never share a prefix
_RUN_TOKEN = secrets.token_hex(2)
_prefix_numbers = itertools.count(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "reactor_celery_app",
        "Celery app of the workers celery_worker_process starts (celery -A <app>); "
        "default: the package of DJANGO_SETTINGS_MODULE",
        default="",
    )


# --------------------------------------------------------------------------------------------
# helpers (importable: the project's own conftest and tools reuse them)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def new_key_prefix(stem: str = "rt") -> str:
    """A ``REACTOR_KEY_PREFIX`` no other test (of this or a concurrent run) uses."""
    return f"{stem}-{os.getpid()}-{_RUN_TOKEN}-{next(_prefix_numbers)}"


def delete_prefixed_keys(client: Any, prefix: str) -> int:
    """Delete every key under ``<prefix>:`` (SCAN + UNLINK, never KEYS/FLUSHDB); the count."""
    deleted = 0
    batch: list[str] = []
    for name in client.scan_iter(match=f"{glob_escape(prefix)}:*", count=500):
        batch.append(name)
        if len(batch) >= 500:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def configured_redis_url() -> str | None:
    """The coordination Redis URL as configured now, without connecting or starting anything
    (None when neither a URL nor an embedded-server folder is configured)."""
    if reactor_settings.REDIS_URL and not reactor_settings.USES_EMBEDDED_REDIS:
        return reactor_settings.REDIS_URL
    if not reactor_settings.USES_EMBEDDED_REDIS:
        return None
    directory = reactor_settings.EMBEDDED_REDIS_DIR or str(Path.cwd() / ".reactor")
    return embedded.url(directory)


#: the Celery options a task copies from the app's configuration when it is first bound, and
#: the configuration each comes from
_TIME_LIMITS = (("time_limit", "task_time_limit"), ("soft_time_limit", "task_soft_time_limit"))


def refresh_task_time_limits() -> None:
    """Make reactor_app's tasks take their time limits from the Celery configuration as it is
    now (the test's settings).

    WHY: Celery copies ``task_time_limit`` and ``task_soft_time_limit`` onto a task class the
    first time it binds it, keeps them, and stamps them on every message the task sends (the
    task's execution options, cached too); a worker applies a message's limits before its own.
    A module whose ``WORKER_SETTINGS`` set limits shares them with this process while its tests
    run, so when the task was first bound there, every later module's messages carried them:
    a worker given no soft limit cut its deliveries by one of 2 s. (Only the limits, and only
    reactor_app's tasks, which declare none of their own.)"""
    from reactor_app.tasks import purge, run_execution, sweep

    for proxy in (run_execution, sweep, purge):
        task = getattr(proxy, "_get_current_object", lambda p=proxy: p)()  # shared_task's proxy
        conf = task.app.conf
        for attribute, setting in _TIME_LIMITS:
            setattr(type(task), attribute, conf.get(setting))
        task._exec_options = None  # recomputed from the above at the next send


def apply_settings(request: pytest.FixtureRequest, values: dict[str, Any]) -> None:
    """Set Django settings for the current test: through pytest-django's ``settings`` fixture
    when it exists (so its own overrides unwind in order), else ``override_settings``."""
    if not values:
        return
    try:
        settings = request.getfixturevalue("settings")
    except pytest.FixtureLookupError:
        override = override_settings(**values)
        override.enable()
        request.addfinalizer(override.disable)
        return
    for name, value in values.items():
        setattr(settings, name, value)


def default_celery_app(config: pytest.Config) -> str:
    configured = str(config.getini("reactor_celery_app") or "").strip()
    if configured:
        return configured
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
    if not settings_module:
        raise pytest.UsageError(
            "celery_worker_process needs the Celery app: set the ini option "
            "reactor_celery_app = <package> (the -A of `celery -A <package> worker`)"
        )
    return settings_module.split(".", 1)[0]


def worker_environment(*, settings: dict[str, Any], rootdir: Path) -> dict[str, str]:
    """The environment of a worker process that must see what the current test sees: the
    project's settings plus ``settings``, and the test database of every configured alias."""
    databases: dict[str, str] = {}
    for alias in connections:
        connection = connections[alias]
        name = str(connection.settings_dict["NAME"])
        if connection.vendor == "sqlite" and (
            name == ":memory:" or "mode=memory" in name or not name
        ):
            raise pytest.UsageError(
                f"database {alias!r} is an in-memory SQLite database, which a worker process "
                "cannot share: give it a file, e.g. DATABASES['default']['TEST'] = "
                "{'NAME': BASE_DIR / 'test-db.sqlite3'}"
            )
        databases[alias] = name
    env = settings_environment(settings, databases=databases)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(rootdir), env.get("PYTHONPATH", "")) if part
    )
    return env


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def reactor_redis() -> Any:
    """A redis-py client of the coordination Redis (``REACTOR_REDIS_URL``; ``"embedded"``: the
    embedded server)."""
    try:
        url = redis_url()  # starts the embedded server for REACTOR_REDIS_URL = "embedded"
        client = get_client(url)
        client.ping()
    except Exception as exc:
        message = f"the coordination Redis does not answer: {type(exc).__name__}: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return client


def _start_servers(factory: Any) -> Any:
    """Start a ``reactor_app.testing.servers`` topology; fail in CI, skip elsewhere, when the
    machine has no redis-server."""
    try:
        return factory().start()
    except ServerBinaryMissing as exc:
        if in_ci():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def reactor_redis_cluster() -> Iterator[Any]:
    """A 3-master Redis Cluster on loopback ports for the whole run (``.url``, ``.ports``)."""
    cluster = _start_servers(RedisClusterServers)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def reactor_redis_sentinel() -> Iterator[Any]:
    """A fresh master + replica + sentinel (``.url``, ``kill_master()``, ``wait_for_failover``)."""
    servers = _start_servers(SentinelServers)
    try:
        yield servers
    finally:
        servers.stop()


@dataclass
class CeleryWorker:
    """The worker of ``celery_worker_process``: its process, queue, key prefix and the
    settings it shares with the tests that use it."""

    process: WorkerProcess
    queue: str
    prefix: str
    settings: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.process.alive()

    def log(self, tail: int = 80) -> str:
        return self.process.log(tail)


@pytest.fixture(scope="module")
def celery_worker_settings() -> dict[str, Any]:
    """Settings the module's worker and its tests share (override in a module or conftest)."""
    return {}


@pytest.fixture(scope="module")
def celery_worker_concurrency() -> int:
    """Child processes of the module's worker (prefork pool)."""
    return 2


@pytest.fixture(scope="module")
def celery_worker_pool() -> str:
    """The module's worker's pool (``celery worker -P``): prefork. Override it (``threads``,
    ``solo``) to run a module's tests on a worker whose pool runs tasks in its own process."""
    return "prefork"


@pytest.fixture(scope="module")
def celery_worker_process(
    request: pytest.FixtureRequest,
    django_db_setup: Any,
    django_db_blocker: Any,
    celery_worker_settings: dict[str, Any],
    celery_worker_concurrency: int,
    celery_worker_pool: str,
) -> Iterator[CeleryWorker]:
    """A real Celery worker for the test module; see the module docstring."""
    token = secrets.token_hex(4)
    queue = f"reactor-test-{token}"
    prefix = new_key_prefix("rw")
    shared = {
        "REACTOR_CELERY_QUEUE": queue,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "REACTOR_KEY_PREFIX": prefix,
        **celery_worker_settings,
    }
    # what the worker must agree on with the test process even if settings changed at runtime
    worker_only = {
        "REACTOR_REDIS_URL": reactor_settings.REDIS_URL,
        "REACTOR_EMBEDDED_REDIS_DIR": reactor_settings.EMBEDDED_REDIS_DIR,
    }
    with django_db_blocker.unblock():
        env = worker_environment(
            settings={**worker_only, **shared}, rootdir=request.config.rootpath
        )
    process = WorkerProcess(
        default_celery_app(request.config),
        queues=(queue,),
        concurrency=celery_worker_concurrency,
        pool=celery_worker_pool,
        name=queue,
        env=env,
        cwd=request.config.rootpath,
        keep_log=bool(os.environ.get("REACTOR_KEEP_WORKER_LOGS")),
    )
    try:
        process.start()
    except Exception as exc:
        pytest.fail(f"could not start a celery worker: {exc}", pytrace=False)
    worker = CeleryWorker(process=process, queue=queue, prefix=prefix, settings=shared)
    try:
        yield worker
    finally:
        process.stop()
        delete_broker_queue(queue)
        if process.keep_log:
            print(f"worker log kept at {process.log_path}")
        with contextlib.suppress(Exception):
            delete_prefixed_keys(get_client(), prefix)


def _flush_tracking() -> None:
    """Write the test's buffered tracking rows into the test's own database, before it is
    flushed — never into the next test's. A test that runs inside a transaction (rolled back
    when it ends) has its own thread's rows written in it already; what other threads left in
    the buffer would be rolled back with it, so it is dropped instead (``discard``)."""
    if "reactor_app.write_behind" not in sys.modules:
        return
    # deferred: the writer imports the models, which need the app registry pytest-django sets
    # up after loading this plugin (and a run that never wrote a row need not load it at all)
    from django.db import transaction

    from reactor_app.write_behind import get_writer

    try:
        if transaction.get_connection().in_atomic_block:
            get_writer().discard()
        else:
            get_writer().flush()
    except Exception as exc:  # a test without database access, or one that broke it
        warnings.warn(f"could not write buffered tracking rows: {exc}", stacklevel=1)


@pytest.fixture
def reactor_key_space(request: pytest.FixtureRequest) -> Iterator[str]:
    """This test's ``REACTOR_KEY_PREFIX``; every key under it is deleted after the test.

    In a test that uses ``celery_worker_process`` it is the worker's prefix (and the test
    sends to the worker's queue), since a running worker cannot change its settings.
    """
    worker: CeleryWorker | None = None
    if "celery_worker_process" in request.fixturenames:
        worker = request.getfixturevalue("celery_worker_process")
        if not worker.alive():
            pytest.fail(f"the celery worker died:\n{worker.log()}", pytrace=False)
    prefix = worker.prefix if worker else new_key_prefix()
    # Resolved before the test runs: a test may point REACTOR_REDIS_URL elsewhere (even at a
    # dead server), and that override is still in force when this fixture tears down.
    url = configured_redis_url()
    # registered before the settings' own undo, so it runs after it: later tests' messages
    # carry the limits of their own settings, not this module's
    request.addfinalizer(refresh_task_time_limits)
    apply_settings(request, {**(worker.settings if worker else {}), "REACTOR_KEY_PREFIX": prefix})
    refresh_task_time_limits()
    yield prefix
    _flush_tracking()
    if url is None:
        return
    try:
        delete_prefixed_keys(get_client(url), prefix)
    except Exception as exc:  # a test that stopped the Redis must not fail its teardown
        warnings.warn(f"could not clean Redis keys under {prefix!r}: {exc}", stacklevel=1)
