"""Fixtures of the integration tests.

* ``nobody_queue`` — ``REACTOR_CELERY_QUEUE`` set to a queue of the test's own that no worker
  consumes, deleted afterwards: ``run_async`` really sends its message to the broker, and the
  test runs the delivery itself (``deliver``, the task's body) or reads the message back. A
  module that needs more (state of its own to clear) overrides it and asks for this one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reactor_app.testing.workers import delete_broker_queue


@pytest.fixture
def nobody_queue(settings: Any) -> Iterator[str]:
    queue = f"reactor-nobody-{uuid.uuid4().hex[:8]}"
    settings.REACTOR_CELERY_QUEUE = queue
    yield queue
    delete_broker_queue(queue)
