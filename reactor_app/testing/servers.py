"""Throw-away Redis topologies for tests: one plain server, a 3-master Redis Cluster, a master
+ replica + sentinel. Each starts its processes through ``redis_processes`` (loopback ports, a
temporary folder, stopped by the pids started there), over TLS with ``tls_files``.

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

The process and TLS helpers the tests use beside these (``ServerBinaryMissing``,
``redis_server_binary``, ``free_port``, ``TlsFiles``, ``make_tls_files``) are importable from
here too, as they always were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reactor_app.testing.redis_processes import (
    BUS_OFFSET,
    START_TIMEOUT,
    ServerBinaryMissing,
    ServerProcess,
    ServerSet,
    client,
    free_port,
    redis_server_binary,
    wait_until,
)
from reactor_app.testing.tls_files import TlsFiles, make_tls_files

__all__ = [
    "RedisClusterServers",
    "SentinelServers",
    "ServerBinaryMissing",
    "ServerProcess",
    "StandaloneServer",
    "TlsFiles",
    "free_port",
    "make_tls_files",
    "redis_server_binary",
]

CLUSTER_SLOTS = 16384


@dataclass
class StandaloneServer(ServerSet):
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
class RedisClusterServers(ServerSet):
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
            wait_until(self._ready, START_TIMEOUT, "the cluster to report cluster_state:ok")
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
class SentinelServers(ServerSet):
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
        return client(self.sentinel_port)

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
            wait_until(
                lambda: client(replica_port).info("replication").get("master_link_status") == "up",
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

            wait_until(knows_replica, START_TIMEOUT, "the sentinel to discover the replica")
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
            return port != old_port and client(port).info("replication").get("role") == "master"

        wait_until(promoted, timeout, "the sentinel to promote the replica")
        return self.master_port()
