"""Response shapes of the API.

Executions and events are ORM rows; holds are live Redis state (plain serializers over the
dicts of ``live``); contention rows carry the blocker snapshot taken when the execution parked.
Every shape says what an operator needs without a second request: the step (``None`` for a
reactor-level hold), the key, the holder and, for a parked execution, why it waits.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from reactor_app.models import ContentionState, CoordinationEvent, Execution, StepRun
from reactor_app.operator import limit_input
from reactor_app.operator.live import blocker_data
from reactor_app.serialization import readable
from reactor_app.status import ExecutionStatus, StepRunStatus


# Executions and step runs both have a "status" with different choices. Naming their enums
# here (rather than with ENUM_NAME_OVERRIDES in the project's settings) keeps any schema that
# includes these views — the app's own, or a project-wide one — free of naming collisions.
@extend_schema_field(
    {"type": "string", "enum": list(ExecutionStatus.values)}, component_name="ExecutionStatusEnum"
)
class ExecutionStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=ExecutionStatus.choices, read_only=True, **kwargs)


@extend_schema_field(
    {"type": "string", "enum": list(StepRunStatus.values)}, component_name="StepRunStatusEnum"
)
class StepRunStatusField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=StepRunStatus.choices, read_only=True, **kwargs)


class StepRunSerializer(serializers.ModelSerializer):
    status = StepRunStatusField()

    class Meta:
        model = StepRun
        fields = ("step", "kind", "attempt", "status", "started_at", "finished_at", "error")


class ExecutionSerializer(serializers.ModelSerializer):
    status = ExecutionStatusField()
    reactor_name = serializers.CharField(read_only=True)
    parked = serializers.SerializerMethodField(
        help_text="waiting on contention: not a failure, the execution will resume"
    )

    class Meta:
        model = Execution
        fields: tuple[str, ...] = (
            "id",
            "reactor",
            "reactor_name",
            "status",
            "parked",
            "current_step",
            "root",
            "parent",
            "correlation_id",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "superseded_by",
        )

    def get_parked(self, obj: Execution) -> bool:
        return obj.status == ExecutionStatus.PARKED


class BlockerSerializer(serializers.Serializer):
    """Who held the key when the execution parked (a snapshot, not live state)."""

    owner = serializers.CharField(allow_null=True)
    execution = serializers.CharField(allow_null=True)
    step = serializers.CharField(allow_null=True, help_text="None: a reactor-level hold")
    reactor = serializers.CharField(allow_null=True, required=False)
    since = serializers.DateTimeField(allow_null=True, help_text="when the holder acquired")
    ttl = serializers.FloatField(
        allow_null=True, help_text="seconds the hold had left when the execution parked"
    )


class ContentionSerializer(serializers.ModelSerializer):
    """A parked execution: the step that could not be admitted and why."""

    execution_status = serializers.CharField(source="execution.status", read_only=True)
    reactor = serializers.CharField(source="execution.reactor", read_only=True)
    level = serializers.SerializerMethodField()
    blocker = serializers.SerializerMethodField()

    class Meta:
        model = ContentionState
        fields = (
            "id",
            "execution",
            "execution_status",
            "reactor",
            "level",
            "step",
            "primitive",
            "key",
            "attempts",
            "next_attempt_at",
            "blocker",
            "updated_at",
        )

    def get_level(self, obj: ContentionState) -> str:
        return "step" if obj.step else "reactor"

    @extend_schema_field(BlockerSerializer(allow_null=True))
    def get_blocker(self, obj: ContentionState) -> dict[str, Any] | None:
        data = blocker_data(obj.blocker)
        return BlockerSerializer(data).data if data else None


class StoredValueField(serializers.JSONField):
    """Inputs and results as people read them: codec-tagged values (``Decimal``, dates) shown
    in their plain JSON form (``reactor_app.serialization.readable``)."""

    def to_representation(self, value: Any) -> Any:
        return readable(value)


#: step runs an execution's detail carries inline; all of them are paged at
#: ``executions/<id>/step-runs/`` (a 10,000-element map has 10,000 of them)
DETAIL_STEP_RUNS = 100


class ExecutionDetailSerializer(ExecutionSerializer):
    inputs = StoredValueField(read_only=True)
    result = StoredValueField(read_only=True)
    step_runs = serializers.SerializerMethodField(
        help_text=f"the first {DETAIL_STEP_RUNS} step runs, oldest first; all of them, paged, "
        "at executions/<id>/step-runs/"
    )
    step_runs_count = serializers.SerializerMethodField(help_text="how many step runs it has")
    contention = serializers.SerializerMethodField(
        help_text="why the execution is parked (empty unless parked)"
    )

    class Meta(ExecutionSerializer.Meta):
        fields = (
            *ExecutionSerializer.Meta.fields,
            "inputs",
            "result",
            "rollback_failures",
            "step_runs",
            "step_runs_count",
            "contention",
        )

    @extend_schema_field(StepRunSerializer(many=True))
    def get_step_runs(self, obj: Execution) -> list[dict[str, Any]]:
        rows = obj.step_runs.order_by("started_at", "id")[:DETAIL_STEP_RUNS]
        return list(StepRunSerializer(rows, many=True).data)

    def get_step_runs_count(self, obj: Execution) -> int:
        return int(obj.step_runs.count())

    @extend_schema_field(ContentionSerializer(many=True))
    def get_contention(self, obj: Execution) -> list[dict[str, Any]]:
        if obj.status != ExecutionStatus.PARKED:
            return []
        rows = obj.contention.select_related("execution").order_by("id")
        return list(ContentionSerializer(rows, many=True).data)


class CoordinationEventSerializer(serializers.ModelSerializer):
    level = serializers.SerializerMethodField()

    class Meta:
        model = CoordinationEvent
        fields = (
            "id",
            "at",
            "kind",
            "primitive",
            "key",
            "level",
            "step",
            "reactor",
            "execution",
            "owner",
            "token",
            "detail",
        )

    def get_level(self, obj: CoordinationEvent) -> str:
        return "step" if obj.step else "reactor"


class HoldSerializer(serializers.Serializer):
    """One live hold, read from Redis, attributed to the step (or reactor) that took it."""

    primitive = serializers.CharField()
    key = serializers.CharField()
    level = serializers.ChoiceField(choices=["step", "reactor"])
    step = serializers.CharField(allow_null=True, help_text="None: a reactor-level hold")
    owner = serializers.CharField(help_text="root execution id (or a Step.call id)")
    execution = serializers.CharField(allow_null=True)
    execution_status = serializers.CharField(allow_null=True, required=False)
    reactor = serializers.CharField(allow_null=True)
    acquired_at = serializers.DateTimeField(allow_null=True)
    ttl_left = serializers.FloatField(allow_null=True, help_text="seconds")
    count = serializers.IntegerField(help_text="nesting count (re-entrant holds)")
    token = serializers.IntegerField(allow_null=True, help_text="fencing token (locks)")
    limit = serializers.IntegerField(
        allow_null=True,
        required=False,
        help_text="semaphore limit, as its latest admission declared it (semaphores)",
    )


class HoldPageSerializer(serializers.Serializer):
    """A page of live holds. Follow ``next`` (a cursor link) for the following page."""

    count = serializers.IntegerField(
        allow_null=True,
        help_text="holds matching, from the index; null when only reading them all could tell",
    )
    totals = serializers.DictField(
        child=serializers.IntegerField(), help_text="live holds per primitive, from the index"
    )
    next = serializers.CharField(allow_null=True, help_text="URL of the next page, or null")
    previous = serializers.CharField(allow_null=True, help_text="always null (cursor paging)")
    results = HoldSerializer(many=True)


class CancelSerializer(serializers.Serializer):
    """The body of ``POST executions/<id>/cancel/``: why (shown on the execution and audited)."""

    reason = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=1000, trim_whitespace=True
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        initial = getattr(self, "initial_data", {}) or {}
        if not isinstance(initial.get("reason", ""), str):
            # DRF would turn 123 into "123": a reason is text or absent
            raise serializers.ValidationError({"reason": ["must be a string"]})
        unknown = set(initial) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {name: ["unknown field; only 'reason' is accepted"] for name in sorted(unknown)}
            )
        return attrs


class LimitSerializer(serializers.Serializer):
    """A named limit: what settings say, what is in force, and why (``operator.limits``)."""

    primitive = serializers.CharField()
    name = serializers.CharField()
    settings = serializers.JSONField(allow_null=True, help_text="the value settings give")
    effective = serializers.JSONField(allow_null=True, help_text="the value every process obeys")
    effective_text = serializers.CharField()
    origin = serializers.CharField(help_text='"settings" or "override by <user> at <time> UTC"')
    overridden = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True)
    in_sync = serializers.BooleanField(help_text="the published override is the recorded one")


class LimitOverrideSerializer(serializers.Serializer):
    """The body of ``POST limits/`` (set; ``value`` required) and ``POST limits/remove/``."""

    primitive = serializers.ChoiceField(choices=["semaphore", "rate_limit"])
    name = serializers.CharField(max_length=255)
    value = serializers.CharField(
        max_length=255,
        required=False,
        help_text="semaphore: 5 · rate limit: 3/second, 100/minute (or 100 for one window)",
    )
    reason = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=1000, trim_whitespace=True
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        initial = getattr(self, "initial_data", {}) or {}
        if not hasattr(initial, "keys"):
            raise serializers.ValidationError("the body must be an object")
        unknown = set(initial) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                {name: ["unknown field"] for name in sorted(map(str, unknown))}
            )
        try:
            limit_input.check_named(
                attrs["primitive"], attrs["name"], removing=not self.context.get("setting")
            )
        except limit_input.InvalidLimit as exc:
            raise serializers.ValidationError({"name": [str(exc)]}) from exc
        if self.context.get("setting"):
            value = initial.get("value")
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise serializers.ValidationError({"value": ["required: text such as '5'"]})
            try:
                attrs["parsed"] = limit_input.parse_value(attrs["primitive"], attrs["name"], value)
            except limit_input.InvalidLimit as exc:
                raise serializers.ValidationError({"value": [str(exc)]}) from exc
        return attrs


class ErrorSerializer(serializers.Serializer):
    """A 400/503 body: ``{"<parameter>": ["message"]}`` or ``{"detail": "message"}``."""

    detail = serializers.CharField(required=False)
