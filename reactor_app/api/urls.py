"""URLs of the API; mount with ``path("api/reactor/", include("reactor_app.api.urls"))``.

``executions/``, ``holds/``, ``events/``, ``contention/``, ``limits/``, the OpenAPI schema at
``schema/`` (self-contained: ``api.schema``) and a root listing them all at the mount point.
"""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from reactor_app.api import views
from reactor_app.api.schema import ApiRoot, ReactorSchemaView

app_name = "reactor_api"

router = SimpleRouter()
router.register("executions", views.ExecutionViewSet, basename="execution")
router.register("holds", views.HoldViewSet, basename="hold")
router.register("events", views.EventViewSet, basename="event")
router.register("contention", views.ContentionViewSet, basename="contention")
router.register("limits", views.LimitViewSet, basename="limit")

urlpatterns = [
    path("", ApiRoot.as_view(), name="root"),
    path("schema/", ReactorSchemaView.as_view(), name="schema"),
    path("", include(router.urls)),
]
