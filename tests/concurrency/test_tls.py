"""TLS with an ACL user, on one server and on a Redis Cluster, all started here with a
throw-away CA: the CA option is what makes the connection verify (without it, it fails as
``CoordinationUnavailable``), and the credentials reach every node the cluster client finds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reactor_app.coordination.admission import Coordinator
from reactor_app.coordination.claims import Admitted, Holder, LockClaim, SemaphoreClaim
from reactor_app.coordination.keys import hash_slot, key
from reactor_app.coordination.redis import is_cluster
from reactor_app.exceptions import CoordinationUnavailable
from reactor_app.testing.pytest_plugin import in_ci
from reactor_app.testing.servers import (
    RedisClusterServers,
    ServerBinaryMissing,
    StandaloneServer,
    TlsFiles,
    make_tls_files,
)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

USER, PASSWORD = "reactor-tls", "tls-pw"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory, reactor_redis_cluster: Any) -> TlsFiles:
    """Certificates for this module (``reactor_redis_cluster`` only for its verdict on the
    redis-server binary: fail in CI, skip elsewhere)."""
    try:
        return make_tls_files(Path(tmp_path_factory.mktemp("tls")))
    except ServerBinaryMissing as exc:
        if in_ci():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


def add_acl_user(servers: Any, ports: list[int]) -> None:
    for port in ports:
        servers._client(port).execute_command(
            "ACL", "SETUSER", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all"
        )


def admit_and_release(claims: list[Any]) -> None:
    coordinator = Coordinator()
    admitted = coordinator.admit(claims, Holder(owner="tls"))
    assert isinstance(admitted, Admitted), admitted
    coordinator.release(admitted, "success")


@pytest.fixture
def tls_server(tls_files: TlsFiles) -> Iterator[StandaloneServer]:
    with StandaloneServer(tls=tls_files) as server:
        add_acl_user(server, [server.port])
        yield server


def test_one_server_over_tls_with_an_acl_user(
    tls_server: StandaloneServer, tls_files: TlsFiles, settings: Any
) -> None:
    settings.REACTOR_REDIS_URL = None
    settings.REACTOR_REDIS = {
        "url": f"rediss://127.0.0.1:{tls_server.port}/0",
        "ssl_ca_certs": str(tls_files.ca),
        "username": USER,
        "password": PASSWORD,
    }
    assert Coordinator().client.acl_whoami() == USER
    admit_and_release([LockClaim("acct:1"), SemaphoreClaim("acct:1", limit=2)])

    settings.REACTOR_REDIS = {"url": f"rediss://127.0.0.1:{tls_server.port}/0"}  # no CA
    with pytest.raises(CoordinationUnavailable):
        admit_and_release([LockClaim("acct:1")])


def test_a_cluster_over_tls_with_an_acl_user(tls_files: TlsFiles, settings: Any) -> None:
    with RedisClusterServers(tls=tls_files) as cluster:
        add_acl_user(cluster, cluster.ports)
        first = cluster.ports[0]
        settings.REACTOR_REDIS_URL = (
            f"rediss+cluster://{USER}:{PASSWORD}@127.0.0.1:{first}/?ssl_ca_certs={tls_files.ca}"
        )
        coordinator = Coordinator()
        assert is_cluster(coordinator.client) and coordinator.client.acl_whoami() == USER
        accounts = [f"tls:{n}" for n in range(40)]
        ports = {cluster.port_of_slot(hash_slot(key("lock", a))) for a in accounts}
        assert len(ports) == 3  # the claims below reach every node
        for account in accounts[:10]:
            admit_and_release([LockClaim(account), SemaphoreClaim("tls-pool", limit=3)])

        settings.REACTOR_REDIS_URL = f"rediss+cluster://{USER}:{PASSWORD}@127.0.0.1:{first}/"
        with pytest.raises(CoordinationUnavailable):  # no CA: the certificate cannot verify
            admit_and_release([LockClaim("tls:0")])
