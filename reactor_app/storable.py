"""What the database can store of text and numbers, and a storable copy of what it cannot.

PostgreSQL's ``text`` and ``jsonb`` refuse a NUL character; no JSON reader takes a lone
surrogate (a ``str`` may hold one: ``"\\ud800"``, or ``json.loads`` of that escape); JSON has
no NaN or infinity. A value holding one of them failed the ``INSERT`` or ``UPDATE`` that
carried it — the whole statement, with the rows riding in it. ``serialization.encode`` refuses
such data where it must come back as it was (inputs, results); what is only shown (error
messages, event details, a display copy of inputs) is made storable here instead: U+FFFD for
such characters, a non-finite float's ``repr``. A leaf module: ``exceptions`` uses it too.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: surrogate code points: alone in a ``str`` they are no text the database (or UTF-8) holds
_SURROGATES = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why the database cannot store ``text``, or None."""
    if "\0" in text:
        return "a NUL character (\\x00)"
    if not text.isascii() and _SURROGATES.search(text):
        return "a lone surrogate (not text UTF-8 can encode)"
    return None


def storable_text(text: str) -> str:
    """``text`` with what the database cannot store replaced by U+FFFD (display only)."""
    if text_problem(text) is None:
        return text
    return _SURROGATES.sub("\ufffd", text.replace("\0", "\ufffd"))


def storable(data: Any) -> Any:
    """JSON ``data`` the database can store: text with U+FFFD for what it cannot hold, a
    non-finite float as its ``repr`` (display data only: it changes the value)."""
    if isinstance(data, str):
        return storable_text(data)
    if isinstance(data, float):
        return data if math.isfinite(data) else repr(data)
    if isinstance(data, list):
        return [storable(item) for item in data]
    if isinstance(data, dict):
        return {storable_text(key): storable(item) for key, item in data.items()}
    return data


def may_need_storable(json_text: str) -> bool:
    """Whether JSON text written by ``json.dumps`` may hold what the database cannot store:
    the escape of a NUL or of a surrogate (a pair is fine, a lone one is not), NaN or an
    infinity. A cheap look before the walk of ``storable``, which is rarely needed."""
    return (
        "\\u0000" in json_text
        or "\\ud" in json_text
        or "NaN" in json_text
        or "Infinity" in json_text
    )
