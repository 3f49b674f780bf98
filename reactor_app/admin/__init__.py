"""The admin: read-only runtime records, parked executions with why, and the Coordination page.

One module per model admin, and one per family of the Coordination pages:

* ``executions`` — the executions, with step runs and coordination events inline; their
  operator actions are ``cancel`` and ``retry`` (each makes a change, so each has its own pages);
* ``parked`` — parked executions, and exactly what each waits on;
* ``events`` — the history of every hold;
* ``coordination`` — the live Coordination pages, hung off the ``Coordination`` proxy:
  ``dashboard`` (live holds and key states), ``key_timeline`` and ``operator_actions``
  (force-release, ordered-lock skip and reset), sharing ``pages`` and ``forms``.

``display`` (badges, JSON, links), ``links`` (admin URLs) and ``permissions`` (the operator
permission) serve them all. Runtime records are written by the engine only, so every ModelAdmin
here is read-only. Django's admin autodiscovery imports this package, which registers them.
"""

from reactor_app.admin import coordination, events, executions, parked  # noqa: F401  (registers)
