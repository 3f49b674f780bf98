"""The API's own OpenAPI schema and root: nothing to configure in the project.

``ReactorSchemaView`` describes only reactor_app's URLconf (never the whole project, whose other
views may use any schema class or none), with drf-spectacular's ``AutoSchema`` set on reactor_app's
views themselves (``views.ReactorAPIMixin.schema``) and its settings passed per view — so
``GET schema/`` works without ``DEFAULT_SCHEMA_CLASS``, ``SPECTACULAR_SETTINGS`` or
``drf_spectacular`` in ``INSTALLED_APPS``. Paths carry the prefix the app is mounted under,
read from the request (``/api/reactor/`` in the documented setup).

``ApiRoot`` answers the mount point itself with links to every listing and the schema.
"""

from __future__ import annotations

from typing import Any

from django.urls import include, path, reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from reactor_app.api.permissions import configured_permissions

#: drf-spectacular settings of this schema only (the project's own are left alone)
SCHEMA_SETTINGS: dict[str, Any] = {
    "TITLE": "reactor_app API",
    "DESCRIPTION": "Executions, live holds, coordination events and contention of reactor_app.",
    "VERSION": "1",
}

#: the listings the root links to: URL name in the ``reactor_api`` namespace → link name
LISTINGS = {
    "execution-list": "executions",
    "hold-list": "holds",
    "event-list": "events",
    "contention-list": "contention",
    "limit-list": "limits",
    "schema": "schema",
}


@extend_schema(exclude=True)  # a project-wide schema (drf-spectacular's own check) skips it
class ReactorSchemaView(SpectacularAPIView):
    """OpenAPI 3 schema of reactor_app's API (JSON with ``?format=json``, else YAML)."""

    custom_settings = SCHEMA_SETTINGS
    schema = AutoSchema()

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # deferred: a real cycle, api.urls imports this module to route to this view
        from reactor_app.api.urls import router

        mount = request.path[: -len("schema/")] if request.path.endswith("schema/") else "/"
        # A fresh list per request: the generator walks these patterns, prefixed as mounted.
        self.patterns = [path(mount.lstrip("/"), include(router.urls))]
        return super().get(request, *args, **kwargs)


@extend_schema(exclude=True)  # an index of links, not an operation worth describing
class ApiRoot(APIView):
    """Links to the API's listings and its schema."""

    schema = AutoSchema()

    def get_permissions(self) -> list[BasePermission]:
        return configured_permissions()

    def get(self, request: Request) -> Response:
        namespace = request.resolver_match.namespace if request.resolver_match else "reactor_api"
        return Response(
            {
                label: request.build_absolute_uri(reverse(f"{namespace}:{name}"))
                for name, label in LISTINGS.items()
            }
        )
