"""The demo project: settings, URLs and the Celery app that run reactor_app end to end."""

from __future__ import annotations

from demo_project.celery import app as celery_app

__all__ = ["celery_app"]
