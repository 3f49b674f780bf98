"""The reactor_app REST API (DRF): executions, live holds, coordination events, contention.

Mount it with ``path("api/reactor/", include("reactor_app.api.urls"))``. Read-only but for
``POST executions/<id>/cancel/`` (which needs ``reactor_app.cancel_execution``), staff-only
by default (``REACTOR_API_PERMISSION_CLASSES``), paginated, described by an OpenAPI schema at
``schema/``. Every invalid query parameter is a 400 with a message naming the parameter.
"""
