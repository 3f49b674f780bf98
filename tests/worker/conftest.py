"""Real Celery workers for the worker tests (docs/design.md §5, §8).

The worker is the shipped plugin's ``celery_worker_process`` (``reactor_app.testing``): one
``celery -A demo_project worker -P prefork -c 2`` subprocess per test module, against the
suite's test database and Redis — never eager mode — on a queue and key prefix of its own. A
module tunes it with ``WORKER_SETTINGS`` (backoff, ceiling, claim TTL...), which the worker and
the module's tests share.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def celery_worker_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(getattr(request.module, "WORKER_SETTINGS", {}))


@pytest.fixture
def worker(celery_worker_process: Any) -> Iterator[Any]:
    """The module's worker, checked alive before and after each test (its log on failure)."""
    assert celery_worker_process.alive(), f"the worker died:\n{celery_worker_process.log()}"
    yield celery_worker_process
    assert celery_worker_process.alive(), f"the worker died:\n{celery_worker_process.log()}"


@pytest.fixture(autouse=True)
def fresh_traces(redis_prefix: str) -> None:
    """Tests of one module share the worker's key prefix: start each with no step traces."""
    from reactor_app.coordination.redis import get_client

    client = get_client()
    names = list(client.scan_iter(match=f"{redis_prefix}:test:*"))
    if names:
        client.unlink(*names)
