"""Who may read the API: staff by default, configurable with ``REACTOR_API_PERMISSION_CLASSES``.

The setting is a list of dotted paths of DRF permission classes, read on every request (so
``override_settings`` applies) and combined with AND, as DRF does with ``permission_classes``.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from reactor_app.conf import reactor_settings
from reactor_app.exceptions import ConfigurationError


class IsStaffUser(BasePermission):
    """Authenticated staff members only: holds, keys and inputs are operational data."""

    message = "the reactor API is restricted to staff users"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_staff)


def configured_permissions() -> list[BasePermission]:
    """Instances of the classes named by ``REACTOR_API_PERMISSION_CLASSES``."""
    permissions = []
    for path in reactor_settings.API_PERMISSION_CLASSES:
        try:
            permission_class = import_string(path) if isinstance(path, str) else path
        except ImportError as exc:
            raise ConfigurationError(
                f"REACTOR_API_PERMISSION_CLASSES: cannot import {path!r} ({exc})",
                setting="API_PERMISSION_CLASSES",
            ) from exc
        permissions.append(permission_class())
    return permissions
