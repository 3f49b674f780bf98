"""The demo project's Celery app (``celery -A demo_project worker``).

With no ``REDIS_URL`` the broker is the embedded Redis server (see
``reactor_app.coordination.embedded``). It is started, if nothing answers on its socket yet, as
soon as the app reads its configuration — before any broker connection — so a worker, a
``celery inspect`` or a web process sending a task works on a machine where nothing is running.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

app = Celery("demo_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _start_embedded_redis(sender: Any, **kwargs: Any) -> None:
    from django.conf import settings

    directory = getattr(settings, "REACTOR_EMBEDDED_REDIS_DIR", None)
    if directory and not getattr(settings, "REDIS_URL", None):
        from reactor_app.coordination import embedded

        embedded.ensure_server(directory)
