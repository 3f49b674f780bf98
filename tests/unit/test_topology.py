"""``REACTOR_REDIS`` / ``REACTOR_REDIS_URL``: the three topologies, TLS and ACL options in each,
and the system check that rejects what cannot work before the first step does."""

from __future__ import annotations

from typing import Any

import pytest

from reactor_app.checks import check_redis_topology
from reactor_app.coordination.topology import Topology
from reactor_app.coordination.topology_settings import configured_topology, from_dict, from_url
from reactor_app.exceptions import ConfigurationError


def test_one_server_urls_stay_one_server() -> None:
    assert from_url("redis://127.0.0.1:6379/3").kind == "standalone"
    assert from_url("unix:///tmp/r.sock?db=2").kind == "standalone"
    secure = from_url("rediss://u:p@redis.internal:6380/0?ssl_ca_certs=/ca.pem")
    assert secure.ssl and dict(secure.tls) == {"ssl_ca_certs": "/ca.pem"}


def test_cluster_url_with_acl_and_tls() -> None:
    topology = from_url(
        "rediss+cluster://reactor:s%40cret@10.0.0.1:7001,10.0.0.2:7002/"
        "?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required"
    )
    assert topology.kind == "cluster"
    assert topology.nodes == (("10.0.0.1", 7001), ("10.0.0.2", 7002))
    kwargs = topology.connection_kwargs()
    assert kwargs["username"] == "reactor" and kwargs["password"] == "s@cret"
    assert kwargs["ssl"] is True
    assert kwargs["ssl_ca_certs"] == "/ca.pem" and kwargs["ssl_cert_reqs"] == "required"
    assert "s@cret" not in repr(topology) and "s@cret" not in topology.describe()


def test_sentinel_url_names_the_master_and_database() -> None:
    topology = from_url("redis+sentinel://app:pw@s1:26379,s2/mymaster/2?sentinel_password=spw")
    assert topology.kind == "sentinel"
    assert topology.nodes == (("s1", 26379), ("s2", 26379))
    assert (topology.service_name, topology.db) == ("mymaster", 2)
    assert (topology.username, topology.password) == ("app", "pw")
    assert topology.sentinel_password == "spw"


def test_dict_forms_in_the_style_of_django_redis() -> None:
    cluster = from_dict(
        {
            "cluster": True,
            "startup_nodes": ["10.0.0.1:7001", ("10.0.0.2", 7001), {"host": "h3", "port": 7003}],
            "username": "reactor",
            "password": "pw",
            "ssl": True,
            "ssl_ca_certs": "/ca.pem",
            "ssl_certfile": "/client.crt",
            "ssl_keyfile": "/client.key",
        }
    )
    assert cluster.kind == "cluster" and len(cluster.nodes) == 3
    kwargs = cluster.connection_kwargs()
    assert kwargs["ssl_certfile"] == "/client.crt" and kwargs["username"] == "reactor"

    sentinel = from_dict(
        {"sentinels": ["s1:26379", "s2:26379"], "service_name": "mymaster", "db": 1}
    )
    assert (sentinel.kind, sentinel.service_name, sentinel.db) == ("sentinel", "mymaster", 1)

    plain = from_dict({"url": "rediss://redis:6380/0", "ssl_ca_certs": "/ca.pem", "password": "p"})
    assert plain.kind == "standalone"
    assert plain.connection_kwargs()["password"] == "p"
    assert plain.connection_kwargs()["ssl_ca_certs"] == "/ca.pem"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("redis://a:6379,b:6379/0", "redis+cluster://"),
        ("redis+cluster://", "at least one host"),
        ("redis+sentinel://s1:26379", "master's name"),
        ("redis+cluster://h:7001/3", "database 0 only"),
        ("redis+cluster://h:notaport", "bad port"),
        ("memcached://h:1", "unknown scheme"),
        ("redis://h:6379/0?ssl_ca_certs=/ca.pem", "without TLS"),
        ({"cluster": True}, "startup_nodes"),
        ({"sentinels": ["s:26379"]}, "service_name"),
        ({"cluster": True, "startup_nodes": ["a:1"], "sentinels": ["s:2"]}, "choose one"),
        ({"startup_nodes": ["a:1"], "tls": True}, "unknown key"),
        ({"url": "rediss+cluster://a:1", "ssl_cert_reqs": "sometimes"}, "ssl_cert_reqs"),
        ({"url": "redis://h:6379/0", "ssl": True}, "rediss://"),
    ],
)
def test_what_cannot_work_is_a_configuration_error_naming_it(config: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        from_url(config) if isinstance(config, str) else from_dict(config)
    assert says in caught.value.message


def test_the_system_check_reports_it_and_the_embedded_default_is_untouched(
    settings: Any,
) -> None:
    settings.REACTOR_REDIS = None
    settings.REACTOR_REDIS_URL = None
    assert configured_topology() is None  # the embedded server
    assert check_redis_topology() == []

    settings.REACTOR_REDIS_URL = "redis+sentinel://127.0.0.1:26379"
    [error] = check_redis_topology()
    assert error.id == "reactor_app.E030"
    assert error.obj == "REACTOR_REDIS_URL"
    assert "master's name" in error.msg

    settings.REACTOR_REDIS = {"cluster": True, "startup_nodes": ["127.0.0.1:7001"]}
    [error] = check_redis_topology()
    assert "both REACTOR_REDIS and REACTOR_REDIS_URL" in error.msg

    settings.REACTOR_REDIS_URL = None
    assert check_redis_topology() == []
    assert configured_topology() == Topology(kind="cluster", nodes=(("127.0.0.1", 7001),))


def test_one_server_urls_keep_the_plain_client_path(settings: Any) -> None:
    """Only REACTOR_REDIS and the cluster/Sentinel schemes build a Topology client; a one-server
    URL (TLS query options included) stays on the per-URL pool, parsed by redis-py itself."""
    from reactor_app.coordination.redis import _topology_for

    settings.REACTOR_REDIS = None
    url = "rediss://127.0.0.1:6380/0?ssl_ca_certs=/ca.pem"
    settings.REACTOR_REDIS_URL = url
    assert _topology_for(None) == url
    assert _topology_for("redis://127.0.0.1:6379/2") == "redis://127.0.0.1:6379/2"
    assert isinstance(_topology_for("redis+cluster://127.0.0.1:7001"), Topology)
    settings.REACTOR_REDIS_URL = None
    settings.REACTOR_REDIS = {"url": "redis://127.0.0.1:6379/3"}
    assert _topology_for(None) == "redis://127.0.0.1:6379/3"
    settings.REACTOR_REDIS = {"url": "redis://127.0.0.1:6379/3", "password": "pw"}
    assert isinstance(_topology_for(None), Topology)


# -- the hints a failing call carries (coordination.probe.hint_for; no network) ---------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        # Redis 7 quotes the command with apostrophes, Redis 6 with backticks
        (
            "ResponseError:unknown command 'SENTINEL', with args beginning with: 'MASTERS'",
            "is not a Sentinel",
        ),
        ("ResponseError:unknown command `SENTINEL`, with args beginning with: ", "not a Sentinel"),
        ("MasterNotFoundError:No master found for 'nosuch'", "put the name the sentinels"),
        (
            "MasterNotFoundError:No master found for 'm' : Sentinel<...> - ConnectionError()",
            "check the host and port",
        ),
        (
            "RedisClusterException:Redis Cluster cannot be connected. Please provide at least "
            "one reachable node: Cluster mode is not enabled on this node",
            "has no cluster mode",
        ),
        (
            "RedisClusterException:Redis Cluster cannot be connected. Please provide at least "
            "one reachable node: Error 111 connecting to 127.0.0.1:1. Connection refused.",
            "check the host and port",
        ),
        ("MovedError:3999 127.0.0.1:7002", "redis+cluster://host:port/"),
        ("ClusterCrossSlotError:Keys in request don't hash to the same slot", "redis+cluster://"),
        ("ConnectionError:Error 111 connecting to 127.0.0.1:1.", "check the host and port"),
        ("AuthenticationError:invalid username-password pair", "username and password"),
    ],
)
def test_a_failing_call_says_what_to_change(exc: str, expected: str) -> None:
    import redis
    from redis.sentinel import MasterNotFoundError

    from reactor_app.coordination.probe import hint_for

    kinds = {**vars(redis.exceptions), "MasterNotFoundError": MasterNotFoundError}
    name, _, message = exc.partition(":")
    hint = hint_for(kinds[name](message), "REACTOR_REDIS_URL")
    assert hint is not None and expected in hint, hint
    assert "REACTOR_REDIS_URL" in hint


def test_an_unrelated_reply_gets_no_hint_and_stays_a_step_failure() -> None:
    import redis

    from reactor_app.coordination.probe import hint_for, is_wrong_topology
    from reactor_app.coordination.redis import is_unavailable

    for reply in ("ERR unknown command 'FOO'", "WRONGTYPE Operation against a key", "NOSCRIPT"):
        exc = redis.exceptions.ResponseError(reply)
        assert hint_for(exc) is None
        assert not is_wrong_topology(exc) and not is_unavailable(exc)
    sentinel = redis.exceptions.ResponseError("unknown command 'SENTINEL', with args")
    assert is_wrong_topology(sentinel) and is_unavailable(sentinel)
