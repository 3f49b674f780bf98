"""Fixtures and checks shared by every test under ``tests/``.

* **Services answer, or the run stops.** At session start, an explicit ``DATABASE_URL`` /
  ``REDIS_URL`` must answer; under ``CI`` a silent one ends the run with a clear message (a
  coordination test is never skipped in CI for want of Redis). Without ``REDIS_URL`` the
  embedded Redis server is started (or reused) here, so its failure is reported once, first.
* **A key space per test.** ``redis_prefix`` (autouse) is the ``reactor_key_space`` fixture of
  ``reactor_app.testing.pytest_plugin``: every test gets its own ``REACTOR_KEY_PREFIX`` and
  afterwards that prefix's keys, and only those, are deleted from the coordination Redis — so
  tests never see each other's holds, and a shared Redis (CI's database 15, a developer's
  embedded server) is left as it was found.
* **No SQLite connection crosses a fork.** Tests fork racers (``multiprocessing``'s fork
  context); a connection open in any thread of the parent at that moment — the tracking
  writer's, a second after its last row — would be inherited with SQLite's in-process lock
  bookkeeping, so a child's own connections could skip the file locks they need (lost
  commits, ``database is locked``). Before every fork the writer thread lets go of its
  connection (``_release_writer_before_fork``); the forking thread closes its own.
* **Generated cases are the same on every run.** Hypothesis runs derandomized (profile
  ``reactor``): ``make test`` and CI try the same cases each time, so a run fails because the
  code changed, never by the luck of a seed. ``make soak`` explores with random seeds instead
  (``REACTOR_HYPOTHESIS_PROFILE=reactor-explore``); what it finds is kept as a named
  regression test (docs/testing.md, "Generated cases").
* **Child processes see what the test sees.** ``subprocess_env()`` is the environment for a
  ``python``/``celery`` process started by a test: same test database, same Redis, same key
  prefix. Such tests need ``transactional_db`` (a child cannot see a test's open transaction).
"""

from __future__ import annotations

import os
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import settings as hypothesis_settings

from reactor_app.testing.pytest_plugin import delete_prefixed_keys, new_key_prefix

hypothesis_settings.register_profile("reactor", derandomize=True)
hypothesis_settings.register_profile("reactor-explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("REACTOR_HYPOTHESIS_PROFILE", "reactor"))

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: seconds a service gets to answer the session-start check
SERVICE_CHECK_TIMEOUT = 5.0

# --------------------------------------------------------------------------------------------
# Session start: the services answer
# --------------------------------------------------------------------------------------------


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _database_problem(database_url: str) -> str | None:
    """Why ``database_url``'s server does not answer, or None when it does."""
    parts = urlsplit(database_url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme in ("sqlite", ""):
        return None
    if scheme in ("postgres", "postgresql", "pgsql"):
        import psycopg

        try:
            # The database named in the URL: pytest-django connects to it to create test_<name>.
            psycopg.connect(database_url, connect_timeout=int(SERVICE_CHECK_TIMEOUT)).close()
        except psycopg.Error as exc:
            return f"{type(exc).__name__}: {exc}".strip()
        return None
    try:  # another engine: at least its port must accept a connection
        socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 0), timeout=SERVICE_CHECK_TIMEOUT
        ).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _redis_problem(redis_url: str) -> str | None:
    """Why the Redis at ``redis_url`` does not answer PING, or None when it does."""
    import redis

    client = redis.Redis.from_url(
        redis_url,
        socket_connect_timeout=SERVICE_CHECK_TIMEOUT,
        socket_timeout=SERVICE_CHECK_TIMEOUT,
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def pytest_sessionstart(session: pytest.Session) -> None:
    from django.conf import settings

    problems = []
    embedded_failed = False
    database_url = os.environ.get("DATABASE_URL")
    if database_url:
        problem = _database_problem(database_url)
        if problem:
            problems.append(f"DATABASE_URL={_redacted(database_url)} does not answer: {problem}")
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        problem = _redis_problem(redis_url)
        if problem:
            problems.append(f"REDIS_URL={_redacted(redis_url)} does not answer: {problem}")
    else:
        directory = getattr(settings, "REACTOR_EMBEDDED_REDIS_DIR", None)
        if directory:
            from reactor_app.coordination import embedded

            try:
                embedded.ensure_server(directory)
            except Exception as exc:  # report any failure to start it, then stop the run
                problems.append(f"the embedded Redis server under {directory} failed: {exc}")
                embedded_failed = True

    # The SQLite test database is a file in the state folder, which may not exist yet.
    state_dir = getattr(settings, "STATE_DIR", None)
    if state_dir is not None:
        Path(state_dir).mkdir(parents=True, exist_ok=True)

    if not problems:
        return
    message = "\n".join(f"  - {problem}" for problem in problems)
    if _in_ci() or embedded_failed:
        # In CI a missing service fails the run (it never skips); locally, a broken embedded
        # server would fail every coordination test, so one message is better than hundreds.
        pytest.exit(f"required services are not available:\n{message}", returncode=3)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"WARNING: services do not answer; tests that need them will fail:\n{message}",
            yellow=True,
        )


#: how much of a module's Celery worker log a failed test that used it shows
WORKER_LOG_ON_FAILURE = 300


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran on a real Celery worker reports the end of that worker's log:
    a timeout's cause (a stuck pool, an error in a delivery) is there, and the log is deleted
    with the worker at the end of the module — in CI nothing else keeps it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    worker = funcargs.get("worker") or funcargs.get("celery_worker_process")
    log = getattr(worker, "log", None)
    if callable(log):
        report.sections.append(
            (
                f"celery worker log (its last {WORKER_LOG_ON_FAILURE} lines)",
                log(WORKER_LOG_ON_FAILURE),
            )
        )


# --------------------------------------------------------------------------------------------
# A key space per test
# --------------------------------------------------------------------------------------------

# The plugin (enabled in the top-level conftest.py) owns the key-space machinery; these names
# stay importable from here for the suite's own helpers.
__all__ = ["delete_prefixed_keys", "new_key_prefix"]


@pytest.fixture(autouse=True)
def redis_prefix(reactor_key_space: str) -> str:
    """This test's ``REACTOR_KEY_PREFIX``; its keys are deleted after the test.

    The plugin's ``reactor_key_space``, made autouse for the whole suite (set through
    pytest-django's ``settings``, resolved before the test so a test that re-points
    ``REACTOR_REDIS_URL`` still has its keys cleaned from the suite's Redis).
    """
    return reactor_key_space


# --------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------


def child_environment(**extra: str) -> dict[str, str]:
    """The environment for a child ``python``/``celery`` process of the current test.

    It uses the database the test uses (pytest-django's ``test_<name>`` on PostgreSQL, the test
    file on SQLite), the same Redis (the configured one, else the same embedded server) and the
    test's ``REACTOR_KEY_PREFIX``. ``extra`` is applied last.
    """
    from django.conf import settings
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get(
        "DJANGO_SETTINGS_MODULE", "demo_project.settings"
    )
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if part
    )
    env["REACTOR_KEY_PREFIX"] = settings.REACTOR_KEY_PREFIX

    database_name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        env["REACTOR_SQLITE_PATH"] = database_name
        env.pop("DATABASE_URL", None)
    else:
        env["REACTOR_TEST_DB_NAME"] = database_name

    redis_url = getattr(settings, "REACTOR_REDIS_URL", None)
    if redis_url and redis_url != "embedded":
        env["REDIS_URL"] = redis_url
    else:
        env.pop("REDIS_URL", None)
        # The state folder of the embedded server this process uses (the settings derive
        # REACTOR_EMBEDDED_REDIS_DIR from REACTOR_STATE_DIR).
        embedded_dir = getattr(settings, "REACTOR_EMBEDDED_REDIS_DIR", None)
        if embedded_dir:
            env["REACTOR_STATE_DIR"] = str(embedded_dir)
    env.update(extra)
    return env


@pytest.fixture
def subprocess_env() -> Callable[..., dict[str, str]]:
    """``subprocess_env(**extra)`` → a full environment for ``subprocess.Popen(env=...)``.

    Call it inside the test (after any ``settings`` change), and use ``transactional_db``:
    the child connects to the same database and must see committed rows.
    """
    return child_environment


# --------------------------------------------------------------------------------------------
# Topologies: the same test against one Redis and a real Redis Cluster
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis_topology(
    request: pytest.FixtureRequest, settings: Any, redis_prefix: str
) -> Iterator[str]:
    """Run the test once on the suite's Redis and once on the harness's 3-master cluster.

    On the cluster, ``REACTOR_REDIS_URL`` points at it for the test (forked children inherit
    the setting) and the test's keys are deleted from it afterwards.
    """
    if request.param == "standalone":
        yield "standalone"
        return
    cluster = request.getfixturevalue("reactor_redis_cluster")
    settings.REACTOR_REDIS_URL = cluster.url
    from reactor_app.coordination.redis import get_client, is_cluster

    assert is_cluster(get_client()), "the coordination client did not switch to the cluster"
    yield "cluster"

    delete_prefixed_keys(get_client(cluster.url), redis_prefix)


def _release_writer_before_fork() -> None:
    """Have the tracking writer thread close its database connection before a fork (see the
    module docstring); nothing to wait for when the thread is not running, or when nothing
    imported the writer yet (then it has no thread)."""
    write_behind = sys.modules.get("reactor_app.write_behind")
    if write_behind is not None and not write_behind.get_writer().release_connection():
        warnings.warn("the tracking writer kept its database connection", stacklevel=1)


os.register_at_fork(before=_release_writer_before_fork)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any) -> Iterator[None]:
    """pytest-django's test databases, and before they are dropped, the tracking writer's
    thread lets go of its connection (it would only after a second without rows, and a
    PostgreSQL database still in use cannot be dropped)."""
    yield
    from reactor_app.write_behind import get_writer

    if not get_writer().release_connection():
        warnings.warn("the tracking writer kept its database connection", stacklevel=1)
