"""Turning engine values into the JSON the ORM stores (contexts, results, events, step runs).

Values are kept as real objects in memory while a run is in this process. What is persisted
is their JSON form: Django's encoder covers dates, decimals (as strings) and UUIDs; any other
value JSON cannot hold is stored as its ``repr``. That is enough for the admin and the API,
but a run resumed in another process reads those strings back: steps whose results feed later
steps across a park, an interrupt or a hand-off should return JSON-friendly values.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder


class _Encoder(DjangoJSONEncoder):
    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return repr(o)


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data (what the ORM will store)."""
    return json.loads(json.dumps(value, cls=_Encoder))
