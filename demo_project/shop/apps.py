"""App config of the demo shop."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "demo_project.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"
