"""URLs of the API; mount with ``path("api/reactor/", include("reactor_app.api.urls"))``.

``executions/``, ``holds/``, ``events/``, ``contention/`` and the OpenAPI schema at ``schema/``.
"""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import SimpleRouter

from reactor_app.api import views

app_name = "reactor_api"

router = SimpleRouter()
router.register("executions", views.ExecutionViewSet, basename="execution")
router.register("holds", views.HoldViewSet, basename="hold")
router.register("events", views.EventViewSet, basename="event")
router.register("contention", views.ContentionViewSet, basename="contention")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include(router.urls)),
]
