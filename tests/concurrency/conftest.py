"""Fixtures the concurrency tests share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactor_app.coordination import embedded
from reactor_app.coordination.redis import get_client
from reactor_app.testing.servers import StandaloneServer


@pytest.fixture
def private_redis() -> Iterator[Any]:
    """A Redis server of this test alone, so INFO commandstats counts only our commands
    (``harness.command_calls``). (Under /tmp: a unix socket path must stay short.)"""
    folder = Path(tempfile.mkdtemp(prefix="reactor-stats-", dir="/tmp"))
    embedded.ensure_server(folder)
    try:
        yield get_client(embedded.url(folder))
    finally:
        embedded.stop_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def plain_server() -> Iterator[StandaloneServer]:
    """One plain redis-server on a free loopback TCP port for the module (no cluster mode, no
    Sentinel), which its tests may reconfigure: stopped by its pid afterwards."""
    server = StandaloneServer().start()
    try:
        yield server
    finally:
        server.stop()
