"""The Prometheus scrape view: ``prometheus_client``'s default registry in text format.

``prometheus_client`` is imported inside the view, so including these URLs costs nothing when
it is absent; the view then answers 501 and says what to install.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse


def metrics_view(request: HttpRequest) -> HttpResponse:
    try:  # deferred: prometheus_client is optional (see the module docstring)
        from prometheus_client import REGISTRY, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST
    except ImportError:
        return HttpResponse(
            "prometheus_client is not installed: pip install 'reactor-app[metrics]'\n",
            status=501,
            content_type="text/plain",
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
