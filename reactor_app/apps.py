"""App configuration of reactor_app."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class ReactorAppConfig(AppConfig):
    name = "reactor_app"
    label = "reactor_app"
    verbose_name = "Reactor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # deferred: imported for their side effects, once the app registry is ready (Django's
        # advice for system checks): the checks register themselves, and the tasks register
        # with Celery, so the engine sends them by name (engine.enqueueing) in every process,
        # not only in workers that autodiscover them
        from reactor_app import checks, tasks  # noqa: F401

        # Every installed app's reactors.py, as the admin does with admin.py: reactors register
        # themselves, so checks see their declarations and workers can find them by name.
        autodiscover_modules("reactors")

        # deferred: the writer imports the models, which cannot load before the app registry
        from reactor_app.write_behind import connect_celery_shutdown

        # buffered tracking rows are written when a worker shuts down cleanly
        connect_celery_shutdown()

        # deferred: optional dependencies. Prometheus collectors and OpenTelemetry spans, for
        # whichever of the two is installed; neither is imported (nor any receiver connected)
        # when absent.
        from reactor_app.metrics import install

        install()
