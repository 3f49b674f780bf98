"""The worker path with RabbitMQ as the Celery broker (``amqp://``), coordination on Redis.

Nothing in the library may assume the broker is Redis: parks are countdown requeues, wake-ups
are ordinary enqueues decided by the coordination Redis (pub/sub and waiter sets live there,
never on the broker), the sweeper and claims use the coordination Redis only.

RabbitMQ is a shared service (127.0.0.1:5672, guest/guest, or ``CELERY_TEST_AMQP_URL``). The
module works in a virtual host of its own when ``rabbitmqctl`` may create one (deleted
afterwards, with everything in it); otherwise in the URL's vhost, on a queue (and exchange) of
its own that the worker fixture deletes. Without RabbitMQ the module fails under ``CI`` and
skips elsewhere.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

from reactor_app.testing.pytest_plugin import in_ci
from tests.worker import scenarios

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.django_db(transaction=True)]

AMQP_URL = os.environ.get("CELERY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbitmqctl(*args: str) -> bool:
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        return False
    try:
        done = subprocess.run([tool, *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def rabbitmq_url() -> Iterator[str]:
    parts = urlsplit(AMQP_URL)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 3).close()
    except OSError as exc:
        message = f"RabbitMQ does not answer at {parts.hostname}:{parts.port}: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    vhost = f"reactor-test-{os.getpid()}-{secrets.token_hex(3)}"
    user = unquote(parts.username or "guest")
    if _rabbitmqctl("add_vhost", vhost):
        try:
            if not _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*"):
                pytest.fail(f"could not grant {user} access to the vhost {vhost}")
            yield urlunsplit((parts.scheme, parts.netloc, f"/{vhost}", "", ""))
        finally:
            _rabbitmqctl("delete_vhost", vhost)
    else:  # the shared vhost: private queue names keep us apart
        yield AMQP_URL


@pytest.fixture(scope="module")
def amqp_in_this_process(rabbitmq_url: str) -> Iterator[str]:
    """Point this process's Celery app at RabbitMQ too (``run_async`` enqueues from here)."""
    from demo_project.celery import app

    previous = app.conf.broker_url
    app.conf.broker_url = rabbitmq_url
    app._after_fork()  # drop the connection and producer pools built for the old broker
    try:
        yield rabbitmq_url
    finally:
        app.conf.broker_url = previous
        app._after_fork()


@pytest.fixture(scope="module")
def celery_worker_settings(amqp_in_this_process: str) -> dict[str, Any]:
    return {
        "CELERY_BROKER_URL": amqp_in_this_process,
        # no pidbox exchanges/queues on the shared broker: we do not use remote control
        "CELERY_WORKER_ENABLE_REMOTE_CONTROL": False,
        "REACTOR_CONTENTION_BACKOFF": [15.0, 30.0],
        "REACTOR_CONTENTION_CEILING": 500,
        # the park-and-wake path is under test: no in-delivery wait before parking
        "REACTOR_WORKER_WAIT": 0,
        # a run_after of a few seconds is sent in hops, its due time in an AMQP header
        "REACTOR_LONGEST_COUNTDOWN": 1.0,
    }


def test_the_worker_consumes_from_rabbitmq(worker: Any) -> None:
    from demo_project.celery import app

    assert app.connection_for_write().transport.driver_type == "amqp"
    assert "amqp://" in worker.process.env["REACTOR_TEST_SETTINGS"]
    scenarios.contention_parks_then_completes(account=14)


def test_forty_executions_on_one_key_never_overlap_with_rabbitmq(worker: Any) -> None:
    scenarios.forty_on_one_key_never_overlap(account=15)


def test_parked_waiters_are_woken_by_the_release_with_rabbitmq(worker: Any) -> None:
    scenarios.parked_waiters_are_woken(account=16)


def test_a_long_countdown_arrives_in_hops_with_rabbitmq(worker: Any) -> None:
    """The hazard itself: RabbitMQ closes a channel that holds a delivery unacknowledged past
    its ``consumer_timeout``, which a worker holding a long countdown does."""
    scenarios.a_long_countdown_arrives_in_hops(worker)
