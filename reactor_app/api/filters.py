"""Query parameters of the API, validated by serializers (one per listing).

A serializer rather than ad-hoc parsing gives three things at once: a 400 naming the parameter
and the accepted values, typed values for the managers' filter methods, and the OpenAPI
description of the parameters (drf-spectacular reads the same classes). Blank values mean
"no filter", as an HTML form submits them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from reactor_app.operator.live import HOLD_ORDERINGS, HOLDING_PRIMITIVES, LEVELS, PRIMITIVES
from reactor_app.status import CoordinationEventKind, ExecutionStatus


def _choice(choices: Any, what: str, help_text: str) -> serializers.ChoiceField:
    values = [c[0] if isinstance(c, tuple) else c for c in choices]
    return serializers.ChoiceField(
        choices=values,
        required=False,
        allow_blank=True,
        help_text=help_text,
        error_messages={
            "invalid_choice": f'"{{input}}" is not a known {what}; use one of: ' + ", ".join(values)
        },
    )


def _text(help_text: str) -> serializers.CharField:
    # exact text: coordination keys, owners and names are compared as given (a key with
    # spaces at its ends is another key)
    return serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=512,
        trim_whitespace=False,
        help_text=help_text,
    )


class _Moment(serializers.DateTimeField):
    """DRF's date-time, except that without ``USE_TZ`` an aware one is taken to local time.

    A project without ``USE_TZ`` keeps local time (``TIME_ZONE``) in its columns; DRF turns an
    aware value into naive *UTC* there, so ``created_after=…Z`` would be compared with local
    times, off by the zone's offset (``reactor_app.datetimes``)."""

    def enforce_timezone(self, value: datetime) -> datetime:
        if not settings.USE_TZ and timezone.is_aware(value):
            try:
                return timezone.make_naive(value)
            except (OverflowError, ValueError):  # no local time past year 1 or 9999: a 400
                self.fail("overflow")
        return super().enforce_timezone(value)


def _moment(help_text: str) -> serializers.DateTimeField:
    return _Moment(
        required=False,
        help_text=help_text + " (ISO 8601, e.g. 2025-01-31T12:00:00Z)",
        error_messages={
            "invalid": "not a date-time; use ISO 8601 such as 2025-01-31T12:00:00Z",
        },
    )


class QueryParameters(serializers.Serializer):
    """Base: ``parse`` validates ``request.query_params`` and drops blank values."""

    #: pairs of fields that must be in order (start, end)
    ranges: tuple[tuple[str, str], ...] = ()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for start, end in self.ranges:
            if attrs.get(start) and attrs.get(end) and attrs[start] > attrs[end]:
                raise ValidationError({start: [f"{start} must not be later than {end}"]})
        return attrs

    #: parameters the API understands besides the filters (pagination, format negotiation)
    general = frozenset({"page", "page_size", "format"})

    @classmethod
    def parse(cls, request: Request) -> dict[str, Any]:
        unknown = sorted(set(request.query_params) - set(cls().fields) - cls.general)
        if unknown:
            # A misspelt filter would otherwise be ignored and answer with everything.
            known = ", ".join(sorted({*cls().fields, *cls.general}))
            raise ValidationError(
                {
                    name: [f"unknown query parameter; this listing accepts: {known}"]
                    for name in unknown
                }
            )
        serializer = cls(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        return {k: v for k, v in serializer.validated_data.items() if v not in ("", None)}


class ExecutionFilters(QueryParameters):
    status = _choice(ExecutionStatus.choices, "status", "only executions in this status")
    reactor = _text("dotted path of the reactor class, or its class name")
    created_after = _moment("created at or after")
    created_before = _moment("created at or before")

    ranges = (("created_after", "created_before"),)


class HoldFilters(QueryParameters):
    key = _text("exact coordination key, e.g. acct:1")
    key_prefix = _text(
        "only keys starting with this text, e.g. acct: (then listed by key, not by time)"
    )
    reactor = _text("only holds taken by this reactor (dotted path or class name)")
    cursor = _text("where the page starts: the cursor of the previous page's `next` link")
    primitive = _choice(HOLDING_PRIMITIVES, "holding primitive", "lock or semaphore")
    step = _text("only holds taken by this step (by step name)")
    level = _choice(LEVELS, "level", "step-level or reactor-level holds")
    execution = serializers.UUIDField(
        required=False, help_text="only holds of this execution (its id)"
    )
    ordering = _choice(
        HOLD_ORDERINGS,
        "ordering",
        "acquired (default: oldest first), -acquired, ttl (least time left first) or -ttl; "
        "not with key or key_prefix (listed by key)",
    )

    # cursor pagination: a page number means nothing while holds come and go
    general = frozenset({"page_size", "format"})

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if attrs.get("ordering") and (attrs.get("key") or attrs.get("key_prefix")):
            raise ValidationError(
                {"ordering": ["a listing by key or key_prefix is ordered by key: no ordering"]}
            )
        return attrs


class EventFilters(QueryParameters):
    key = _text("exact coordination key")
    execution = serializers.UUIDField(required=False, help_text="execution id")
    kind = _choice(CoordinationEventKind.choices, "event kind", "event kind")
    primitive = _choice(PRIMITIVES, "primitive", "coordination primitive")
    step = _text("step name")
    since = _moment("at or after")
    until = _moment("at or before")

    ranges = (("since", "until"),)


class ContentionFilters(QueryParameters):
    key = _text("exact coordination key the execution is parked on")
    primitive = _choice(PRIMITIVES, "primitive", "primitive the execution is parked on")
    step = _text("parked step name")
    reactor = _text("dotted path of the reactor class, or its class name")
