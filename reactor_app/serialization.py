"""Turning engine values into the JSON the ORM stores, and back.

Two encoders, for two purposes:

* ``encode`` / ``decode`` — the **codec** for values that cross a process boundary: the inputs
  of ``run_async`` (and of async children), and the step results and arguments kept in
  ``Execution.context`` that a run resumed on another worker reads back after a park, an
  interrupt or a hand-off. JSON data passes through unchanged; ``Decimal``, ``datetime``,
  ``date``, ``time``, ``timedelta`` and ``UUID`` are stored as small tagged objects
  (``{"__reactor_type__": "decimal", "value": "10.50"}``) and come back as the same type and
  value. Anything else raises ``TypeError`` naming where it was found — a model instance, a
  ``set`` or an arbitrary object is never turned into a string behind your back. Teach the
  codec a type of your own with ``register_type``.
* ``to_json`` — a readable, lossy form for display only (events, error details, step-run
  details shown in the admin and the API): Django's encoder for dates and decimals, ``repr``
  for the rest. Nothing the engine reads back goes through it. ``readable`` shows stored codec
  data (inputs, results) the same way.

A tuple is stored tagged too (``{"__reactor_type__": "tuple", "value": [...]}``) and comes back
as a tuple: a worker reads the value the caller passed, not a list in its place. Lists stay
plain JSON lists. Dict keys must be strings. So is a float that PostgreSQL's ``jsonb`` would not
give back as itself — ``-0.0``, and any from ``1e16`` up, which it writes back as an integer
(``_kept_float``); every other float is plain JSON.

Text and numbers the database cannot hold are refused too (``TypeError`` naming their place),
never stored half: a string with a NUL character or a lone surrogate (PostgreSQL's JSON and
text refuse both; JSON cannot even spell a lone surrogate for another reader), and a float
that is NaN or infinite (not JSON). Before, such an input or result reached the ``INSERT``
and failed it with a database error — a raw ``DataError`` from ``run_async``, a run that
could not record its end. ``strict=False`` stores their ``repr``; ``to_json`` (display only)
replaces such characters with U+FFFD and such floats with their ``repr``.

``encoded_form`` is the comparable text of stored codec data: two values are the same call's
inputs when their encoded forms are equal — ``True`` and ``1`` (or ``1`` and ``1.0``) are equal
in Python but stored as different JSON, and come back as different values.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from reactor_app.storable import may_need_storable, storable, text_problem

logger = logging.getLogger(__name__)

#: the key that marks a tagged (non-JSON) value in stored data
TYPE_TAG = "__reactor_type__"
#: the tag of a tuple, whose items are encoded values themselves (not one ``register_type``
#: codec: those map a value to JSON data in one step, a tuple's items need the codec again)
TUPLE = "tuple"
#: the tag of a float that PostgreSQL's JSON would not give back as itself (``_kept_float``)
FLOAT = "float"
#: from here up Python writes a float with an exponent (``1e+16``), which PostgreSQL's
#: ``jsonb`` stores as the number and writes back as ``10000000000000000``: an int when read
_EXPONENT_FROM = 1e16


@dataclass(frozen=True)
class _Codec:
    name: str
    type: type
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_by_type: dict[type, _Codec] = {}
_by_name: dict[str, _Codec] = {}


def register_type(
    cls: type, name: str, *, encode: Callable[[Any], Any], decode: Callable[[Any], Any]
) -> None:
    """Teach the codec a type: ``encode(obj)`` returns JSON data, ``decode(data)`` rebuilds it.

    ``name`` is what is stored, so keep it stable once executions have been persisted with it.
    The exact class is matched (not subclasses), so a subclass never round-trips as its parent.
    Register at import time of a module every process loads (e.g. your app's ``reactors.py``).
    """
    if name in (TUPLE, FLOAT) or cls in (tuple, float):
        raise ValueError(
            f"the codec names {TUPLE!r} and {FLOAT!r}, and their types, are the codec's own"
        )
    codec = _Codec(name, cls, encode, decode)
    existing = _by_name.get(name)
    if existing is not None and existing.type is not cls:
        raise ValueError(f"the codec name {name!r} is already used for {existing.type!r}")
    _by_type[cls] = codec
    _by_name[name] = codec


register_type(Decimal, "decimal", encode=str, decode=Decimal)
register_type(
    dt.datetime, "datetime", encode=dt.datetime.isoformat, decode=dt.datetime.fromisoformat
)
register_type(dt.date, "date", encode=dt.date.isoformat, decode=dt.date.fromisoformat)
register_type(dt.time, "time", encode=dt.time.isoformat, decode=dt.time.fromisoformat)
register_type(
    dt.timedelta,
    "timedelta",
    encode=lambda d: [d.days, d.seconds, d.microseconds],
    decode=lambda parts: dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2]),
)
register_type(uuid.UUID, "uuid", encode=str, decode=uuid.UUID)
# decoded by name only: a float is tagged only when it must be (``_kept_float``)
_by_name[FLOAT] = _Codec(FLOAT, float, repr, float)


def _hint(value: Any) -> str:
    if hasattr(value, "_meta") and hasattr(value, "pk"):
        return "pass its primary key and load the instance inside the step"
    if isinstance(value, (set, frozenset)):
        return "pass a sorted list"
    if isinstance(value, tuple):
        return (
            "pass a plain tuple, or teach the codec its class "
            "(reactor_app.serialization.register_type)"
        )
    return "convert it to JSON data, or teach the codec (reactor_app.serialization.register_type)"


def _unstorable(value: str | float) -> str | None:
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"text with {problem}"
    return None if math.isfinite(value) else f"the float {value!r}, which JSON cannot hold"


def encode(value: Any, *, strict: bool = True, where: str = "value") -> Any:
    """``value`` as JSON data that ``decode`` turns back into an equal value.

    With ``strict`` (the default) a value the codec cannot hold raises ``TypeError`` naming its
    place (``where``, e.g. ``inputs['amount']``). ``strict=False`` stores such a value as its
    ``repr`` and logs a warning — used only for values the engine does not read back as data.
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str) and "\0" not in value and value.isascii():
        return value  # the common case, without a call (results of every step come here)
    if isinstance(value, (str, float)):
        problem = _unstorable(value)
        if problem is None:
            return _kept_float(value) if type(value) is float else value
        return _refused(value, f"{where} is {problem}: the database cannot store it", strict)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if strict:
                    raise TypeError(
                        f"{where} has the key {key!r} ({type(key).__name__}); "
                        "stored mappings need string keys"
                    )
                key = str(key)
            problem = text_problem(key)
            if problem is not None:
                message = (
                    f"{where} has the key {key!r}, with {problem}: the database cannot store it"
                )
                key = _refused(key, message, strict)
            out[key] = encode(item, strict=strict, where=f"{where}[{key!r}]")
        if TYPE_TAG in out and strict:
            raise TypeError(f"{where} uses the reserved key {TYPE_TAG!r}")
        return out
    if isinstance(value, list):
        return [encode(item, strict=strict, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if type(value) is tuple:
        # tagged, not a plain list: read back as a list, it would not be the value passed (a
        # named tuple or another subclass is not matched here: it falls to the codecs below)
        items = [encode(item, strict=strict, where=f"{where}[{i}]") for i, item in enumerate(value)]
        return {TYPE_TAG: TUPLE, "value": items}
    codec = _by_type.get(type(value))
    if codec is not None:
        return {TYPE_TAG: codec.name, "value": codec.encode(value)}
    message = (
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be "
        f"stored for another process to read back: {_hint(value)}"
    )
    return _refused(value, message, strict)


def _kept_float(value: float) -> Any:
    """``value`` as plain JSON, or tagged (``{"__reactor_type__": "float", "value": "-0.0"}``)
    when PostgreSQL's ``jsonb`` would not give it back as itself: it stores numbers as
    ``numeric``, which has no negative zero (``-0.0`` came back ``0.0``) and writes a float from
    ``1e16`` up without its exponent (``1e+16`` came back as the int ``10000000000000000``).
    Either way the same ``run_async`` call with the same idempotency key was then refused as
    another call, and a worker's step received a different value."""
    if abs(value) >= _EXPONENT_FROM or (value == 0.0 and math.copysign(1.0, value) < 0):
        return {TYPE_TAG: FLOAT, "value": repr(value)}
    return value


def _refused(value: Any, message: str, strict: bool) -> str:
    """A value the codec cannot hold: ``TypeError``, or (not ``strict``) its ``repr``, which
    escapes whatever the database could not store."""
    if strict:
        raise TypeError(message)
    logger.warning("%s; storing its repr", message)
    return repr(value)


def decode(value: Any) -> Any:
    """The inverse of ``encode``: tagged objects become their types again."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        tag = value.get(TYPE_TAG)
        if tag == TUPLE and len(value) == 2 and isinstance(value.get("value"), list):
            return tuple(decode(item) for item in value["value"])
        if tag is not None and len(value) == 2 and "value" in value:
            codec = _by_name.get(tag)
            if codec is None:
                raise TypeError(
                    f"stored data names the type {tag!r}, which no codec is registered for in "
                    "this process (register_type must run in every process)"
                )
            return codec.decode(value["value"])
        return {key: decode(item) for key, item in value.items()}
    return value


def encoded_form(stored: Any) -> str:
    """Stored codec data as comparable text: key order does not count (a database may reorder
    a JSON object's keys), types do — ``true`` is not ``1``, ``1`` is not ``1.0``."""
    return json.dumps(stored, sort_keys=True, separators=(",", ":"))


class _Encoder(DjangoJSONEncoder):
    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return repr(o)


class StorableEncoder(_Encoder):
    """``_Encoder`` whose text the database can always store: what it cannot (a NUL in an
    error message...) is replaced (``reactor_app.storable``). For display data only. Used by
    ``json.dumps(cls=...)`` and the ORM's JSON adaptation alike, both of which call
    ``encode``."""

    def encode(self, o: Any) -> str:
        text = super().encode(o)
        if may_need_storable(text):
            text = super().encode(storable(json.loads(text)))
        return text


def to_json(value: Any) -> Any:
    """``value`` as readable JSON data for display (events, details): lossy, never read back.
    Text and floats the database cannot store are replaced (``StorableEncoder``)."""
    return json.loads(json.dumps(value, cls=StorableEncoder))


def readable(stored: Any) -> Any:
    """Stored codec data as people read it (admin, API): ``"10.50"`` rather than a tagged
    object."""
    return to_json(decode(stored))
