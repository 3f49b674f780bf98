"""The settings that say where the coordination Redis is, read into a ``Topology``.

The URL and the dict are two spellings of the one ``Topology`` value (``coordination.topology``),
checked by the same field validators, so both parsers live here together.

Two ways to say it, in the style of django-redis and Celery:

* ``REACTOR_REDIS_URL`` — one URL:

  - ``redis://[user:password@]host:6379/0``, ``rediss://...`` (TLS), ``unix:///path.sock`` —
    one server (the embedded server when the setting is unset);
  - ``redis+cluster://[user:password@]host1:7001,host2:7002/`` (``rediss+cluster://`` for
    TLS) — a Redis Cluster, the hosts being startup nodes (one is enough; more survive a dead
    node at start-up);
  - ``redis+sentinel://[user:password@]host1:26379,host2:26379/mymaster/0``
    (``rediss+sentinel://``) — the master the sentinels know as ``mymaster``, database 0.

  Query parameters carry TLS and Sentinel options: ``ssl_ca_certs``, ``ssl_certfile``,
  ``ssl_keyfile``, ``ssl_cert_reqs`` (``required``/``optional``/``none``),
  ``ssl_check_hostname``, ``sentinel_username``, ``sentinel_password``, ``sentinel_ssl``.

* ``REACTOR_REDIS`` — a dict, for options a URL cannot hold comfortably::

      REACTOR_REDIS = {"cluster": True, "startup_nodes": ["10.0.0.1:7001", ("10.0.0.2", 7001)],
                       "username": "reactor", "password": "...", "ssl": True,
                       "ssl_ca_certs": "/etc/ssl/redis-ca.pem"}
      REACTOR_REDIS = {"sentinels": ["10.0.0.1:26379"], "service_name": "mymaster", "db": 0,
                       "sentinel_password": "..."}
      REACTOR_REDIS = {"url": "rediss://redis.internal:6380/0", "ssl_ca_certs": "..."}

  Keys of the dict override what its ``url`` says. Setting both ``REACTOR_REDIS`` and
  ``REACTOR_REDIS_URL`` is an error (which one wins would be a guess).

``configured_topology()`` parses the settings into a ``Topology`` (or None: the embedded
server); ``Topology.connect()`` (``coordination.topology``) builds the redis-py client. Every
error is a ``ConfigurationError`` whose message names the setting and what is wrong; the system
check (``reactor_app.E030``) shows it at ``manage.py check`` instead of at the first step.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from reactor_app.conf import reactor_settings
from reactor_app.coordination.topology import Kind, Topology, redacted
from reactor_app.exceptions import ConfigurationError

DEFAULT_PORTS = {"standalone": 6379, "cluster": 6379, "sentinel": 26379}
CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
STANDALONE_SCHEMES = {"redis": False, "rediss": True, "unix": False}

#: TLS options accepted in every topology (URL query or ``REACTOR_REDIS`` keys)
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
#: ``REACTOR_REDIS`` keys besides the TLS options
DICT_KEYS = (
    "url",
    "cluster",
    "startup_nodes",
    "sentinels",
    "service_name",
    "db",
    "username",
    "password",
    "ssl",
    "sentinel_username",
    "sentinel_password",
    "sentinel_ssl",
    "options",
    *TLS_OPTIONS,
)
CERT_REQS = ("required", "optional", "none")


def _error(setting: str, message: str) -> ConfigurationError:
    return ConfigurationError(f"REACTOR_{setting}: {message}", setting=setting)


def parse_host_port(entry: Any, kind: Kind, setting: str) -> tuple[str, int]:
    """``"host:port"``, ``("host", port)`` or ``{"host":, "port":}`` -> ``(host, port)``."""
    default = DEFAULT_PORTS[kind]
    host: Any
    port: Any
    if isinstance(entry, str):
        host, sep, port_text = entry.strip().rpartition(":")
        if not sep:
            host, port_text = port_text, str(default)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        port = port_text
    elif isinstance(entry, dict):
        host, port = entry.get("host"), entry.get("port", default)
    elif isinstance(entry, (tuple, list)) and len(entry) == 2:
        host, port = entry
    else:
        raise _error(setting, f"a node must be 'host:port', (host, port) or a dict, got {entry!r}")
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise _error(setting, f"bad port in {entry!r}") from None
    if not host or not isinstance(host, str) or not 0 < number < 65536:
        raise _error(setting, f"bad node {entry!r}: need a host and a port in 1..65535")
    return host, number


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def from_url(url: str, setting: str = "REDIS_URL") -> Topology:
    """Parse one URL of any topology (see the module docstring)."""
    if not isinstance(url, str) or "://" not in url:
        raise _error(
            setting,
            f"expected a redis://, rediss://, unix://, redis+cluster:// or "
            f"redis+sentinel:// URL, got {url!r}",
        )
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme in STANDALONE_SCHEMES:
        return _standalone_url(url, scheme, setting)
    if scheme in CLUSTER_SCHEMES:
        kind: Kind = "cluster"
        ssl = CLUSTER_SCHEMES[scheme]
    elif scheme in SENTINEL_SCHEMES:
        kind = "sentinel"
        ssl = SENTINEL_SCHEMES[scheme]
    else:
        raise _error(
            setting,
            f"unknown scheme {scheme!r}: use redis://, rediss://, unix://, redis+cluster://, "
            "rediss+cluster://, redis+sentinel:// or rediss+sentinel://",
        )
    rest, _, query_text = rest.partition("?")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        credentials, _, netloc = netloc.rpartition("@")
        user_text, has_password, password_text = credentials.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if has_password else None
    hosts = [part for part in netloc.split(",") if part.strip()]
    if not hosts:
        raise _error(setting, f"{scheme}:// needs at least one host:port, got {redacted(url)!r}")
    nodes = tuple(parse_host_port(part, kind, setting) for part in hosts)
    query = dict(parse_qsl(query_text))
    unknown = set(query) - {*TLS_OPTIONS, "sentinel_username", "sentinel_password", "sentinel_ssl"}
    if unknown:
        raise _error(setting, f"unknown URL option(s) {sorted(unknown)} in {redacted(url)!r}")
    values: dict[str, Any] = {
        "kind": kind,
        "nodes": nodes,
        "username": username,
        "password": password,
        "ssl": ssl,
        "tls": tuple((k, query[k]) for k in TLS_OPTIONS if k in query),
    }
    segments = [s for s in path.split("/") if s]
    if kind == "cluster":
        if segments and segments != ["0"]:
            raise _error(setting, "a Redis Cluster has database 0 only; drop the path")
    else:
        if not segments:
            raise _error(
                setting,
                "redis+sentinel:// needs the master's name: redis+sentinel://host:26379/mymaster/0",
            )
        values["service_name"] = unquote(segments[0])
        if len(segments) > 2:
            raise _error(setting, f"too many path segments in {redacted(url)!r}")
        values["db"] = _db(segments[1] if len(segments) > 1 else 0, setting)
        values["sentinel_username"] = query.get("sentinel_username")
        values["sentinel_password"] = query.get("sentinel_password")
        values["sentinel_ssl"] = _bool(query.get("sentinel_ssl", False))
    topology = Topology(**values)
    _validate_tls(topology, setting)
    return topology


def _standalone_url(url: str, scheme: str, setting: str) -> Topology:
    try:
        parts = urlsplit(url)
        if scheme != "unix":
            _ = parts.port  # raises ValueError on a bad port (or a comma-separated host list)
    except ValueError as exc:
        raise _error(
            setting,
            f"cannot parse {redacted(url)!r} ({exc}); several hosts need redis+cluster:// or "
            "redis+sentinel://",
        ) from None
    if scheme != "unix" and not parts.hostname:
        raise _error(setting, f"no host in {redacted(url)!r}")
    tls = tuple((k, v) for k, v in parse_qsl(parts.query) if k in TLS_OPTIONS)
    topology = Topology(kind="standalone", url=url, ssl=STANDALONE_SCHEMES[scheme], tls=tls)
    _validate_tls(topology, setting)
    return topology


def _db(value: Any, setting: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _error(setting, f"the database must be an integer, got {value!r}") from None
    if number < 0:
        raise _error(setting, f"the database must be >= 0, got {number}")
    return number


def _validate_tls(topology: Topology, setting: str) -> None:
    if topology.kind == "standalone" and topology.ssl != (topology.url or "").startswith(
        "rediss://"
    ):
        # one server takes TLS from its URL's scheme only: say so rather than half-apply it
        raise _error(setting, "for one server, TLS is the rediss:// scheme: use it in 'url'")
    tls = dict(topology.tls)
    if tls and not topology.ssl:
        raise _error(
            setting,
            f"TLS options {sorted(tls)} given without TLS: use rediss:// (or 'ssl': True)",
        )
    reqs = tls.get("ssl_cert_reqs")
    if reqs is not None and str(reqs).lower() not in CERT_REQS:
        raise _error(setting, f"ssl_cert_reqs must be one of {CERT_REQS}, got {reqs!r}")


def from_dict(config: dict[str, Any], setting: str = "REDIS") -> Topology:
    """Parse ``REACTOR_REDIS`` (see the module docstring)."""
    if not isinstance(config, dict):
        raise _error(setting, f"must be a dict, got {type(config).__name__}")
    unknown = set(config) - set(DICT_KEYS)
    if unknown:
        raise _error(setting, f"unknown key(s) {sorted(unknown)}; known: {sorted(DICT_KEYS)}")
    has_cluster = _bool(config.get("cluster")) or "startup_nodes" in config
    has_sentinel = "sentinels" in config or "service_name" in config
    if has_cluster and has_sentinel:
        raise _error(setting, "is both a cluster and a sentinel configuration; choose one")
    values: dict[str, Any] = {}
    if config.get("url"):
        base = from_url(config["url"], setting)
        values = {name: getattr(base, name) for name in Topology.__dataclass_fields__}
        if (has_cluster and base.kind != "cluster") or (has_sentinel and base.kind != "sentinel"):
            raise _error(setting, f"'url' is a {base.kind} URL but the other keys say otherwise")
    if has_cluster:
        values["kind"] = "cluster"
        if "startup_nodes" in config:
            values["nodes"] = _nodes(config["startup_nodes"], "cluster", setting)
        if not values.get("nodes"):
            raise _error(setting, "a cluster needs 'startup_nodes' (or a redis+cluster:// 'url')")
    elif has_sentinel:
        values["kind"] = "sentinel"
        if "sentinels" in config:
            values["nodes"] = _nodes(config["sentinels"], "sentinel", setting)
        if not values.get("nodes"):
            raise _error(setting, "a Sentinel set needs 'sentinels', e.g. ['10.0.0.1:26379']")
        if "service_name" in config:
            values["service_name"] = config["service_name"]
        if not values.get("service_name") or not isinstance(values["service_name"], str):
            raise _error(setting, "a Sentinel set needs 'service_name' (the master's name)")
    elif not values:
        raise _error(
            setting,
            "say where Redis is: 'url', or 'cluster': True with 'startup_nodes', or "
            "'sentinels' with 'service_name'",
        )
    if "db" in config:
        if values["kind"] == "cluster" and int(config["db"] or 0) != 0:
            raise _error(setting, "a Redis Cluster has database 0 only")
        if values["kind"] == "standalone":
            raise _error(setting, "put the database in the 'url' (redis://host:6379/<db>)")
        values["db"] = _db(config["db"], setting)
    for name in ("username", "password", "sentinel_username", "sentinel_password"):
        if name in config:
            if config[name] is not None and not isinstance(config[name], str):
                raise _error(setting, f"'{name}' must be a string")
            values[name] = config[name]
    for name in ("ssl", "sentinel_ssl"):
        if name in config:
            values[name] = _bool(config[name])
    tls = dict(values.get("tls", ()))
    tls.update({k: config[k] for k in TLS_OPTIONS if k in config})
    values["tls"] = tuple(sorted(tls.items()))
    options = config.get("options", {})
    if not isinstance(options, dict):
        raise _error(setting, "'options' must be a dict of redis-py client keyword arguments")
    values["options"] = tuple(sorted(options.items()))
    topology = Topology(**values)
    _validate_tls(topology, setting)
    return topology


def _nodes(entries: Any, kind: Kind, setting: str) -> tuple[tuple[str, int], ...]:
    if isinstance(entries, str):
        entries = [part for part in entries.split(",") if part.strip()]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise _error(setting, f"expected a non-empty list of nodes, got {entries!r}")
    return tuple(parse_host_port(entry, kind, setting) for entry in entries)


#: ``REACTOR_REDIS_URL`` values that mean the embedded development server
EMBEDDED_VALUES = ("embedded",)


def is_topology_url(url: str | None) -> bool:
    """True for the schemes only a ``Topology`` understands (cluster, Sentinel)."""
    if not url or "://" not in url:
        return False
    scheme = url.split("://", 1)[0].lower()
    return scheme in CLUSTER_SCHEMES or scheme in SENTINEL_SCHEMES


def configured_topology() -> Topology | None:
    """The configured topology, or None for the embedded server.

    The settings are read on each call (overrides apply at once); parsing is cached per value,
    since every admission asks for its client.
    """
    config = reactor_settings.REDIS
    url = reactor_settings.REDIS_URL
    if config is not None and url:
        raise _error(
            "REDIS",
            "both REACTOR_REDIS and REACTOR_REDIS_URL are set; keep one (put the URL in "
            "REACTOR_REDIS['url'] if you need both a URL and options)",
        )
    if config is not None:
        try:
            frozen = json.dumps(config, sort_keys=True)
        except (TypeError, ValueError):  # not JSON-able (a tuple key...): parse it every time
            return from_dict(config)
        return _from_dict_cached(frozen)
    if url and url not in EMBEDDED_VALUES:
        return cached_from_url(url)
    return None


@lru_cache(maxsize=32)
def cached_from_url(url: str) -> Topology:
    return from_url(url)


@lru_cache(maxsize=32)
def _from_dict_cached(frozen: str) -> Topology:
    return from_dict(json.loads(frozen))
