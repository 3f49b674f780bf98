"""API views: read-only listings of executions, live holds, coordination events and contention,
and two verbs, ``POST executions/<id>/cancel/`` (``engine.cancel``) and the live limits'
``POST limits/`` and ``POST limits/remove/`` (``operator.limits``).

Listings validate their query parameters first (``filters``), so a bad parameter is a 400
before any query runs; the managers own the queries. Holds come from Redis on every request
(``live``): an unreachable Redis is a 503 saying so, never a 500 or an empty list.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.drainage import isolate_view_method
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse, extend_schema
from drf_spectacular.utils import extend_schema_view as spectacular_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from reactor_app.api.filters import ContentionFilters, EventFilters, ExecutionFilters, HoldFilters
from reactor_app.api.pagination import MAX_PAGE_SIZE, ReactorPagination, positive_int
from reactor_app.api.permissions import configured_permissions
from reactor_app.api.serializers import (
    CancelSerializer,
    ContentionSerializer,
    CoordinationEventSerializer,
    ErrorSerializer,
    ExecutionDetailSerializer,
    ExecutionSerializer,
    HoldPageSerializer,
    HoldSerializer,
    LimitOverrideSerializer,
    LimitSerializer,
    StepRunSerializer,
)
from reactor_app.engine.cancel import cancel_execution
from reactor_app.exceptions import (
    CoordinationUnavailable,
    ExecutionNotCancellable,
    InputValidationError,
)
from reactor_app.models import ContentionState, CoordinationEvent, Execution, StepRun
from reactor_app.operator import limit_input, limits, live

UUID_PATTERN = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"

BAD_PARAMETERS = OpenApiResponse(ErrorSerializer, description="an invalid query parameter")
NOT_ALLOWED = OpenApiResponse(ErrorSerializer, description="not authenticated, or not staff")


def extend_schema_view(**methods: Any) -> Any:
    """drf-spectacular's ``extend_schema_view`` built on its own ``AutoSchema`` rather than on
    the project's ``DEFAULT_SCHEMA_CLASS`` (DRF's inspector unless the project changed it),
    which it would otherwise extend for each method — and then fail to describe the view."""

    def decorate(view: Any) -> Any:
        for name in methods:
            method = isolate_view_method(view, name)
            method.kwargs = {"schema": AutoSchema, **getattr(method, "kwargs", {})}
        return spectacular_view(**methods)(view)

    return decorate


class CoordinationStoreUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the coordination Redis is unreachable; live holds cannot be read"
    default_code = "coordination_unavailable"


class ReactorAPIMixin:
    """Shared by every view: configured permissions, bounded pagination."""

    pagination_class: type[ReactorPagination] | None = ReactorPagination
    # drf-spectacular's inspector on our views themselves, so the project needs no
    # DEFAULT_SCHEMA_CLASS (see api.schema)
    schema = AutoSchema()
    request: Request

    def get_permissions(self) -> list[BasePermission]:
        return configured_permissions()

    @property
    def schema_only(self) -> bool:
        # drf-spectacular instantiates views with a fake request to describe them
        return bool(getattr(self, "swagger_fake_view", False))


@extend_schema_view(
    list=extend_schema(
        summary="List executions",
        parameters=[ExecutionFilters],
        responses={200: ExecutionSerializer(many=True), 400: BAD_PARAMETERS, 403: NOT_ALLOWED},
    ),
    retrieve=extend_schema(
        summary="One execution with its step runs and, when parked, why",
        responses={200: ExecutionDetailSerializer, 403: NOT_ALLOWED},
    ),
)
class ExecutionViewSet(ReactorAPIMixin, viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = UUID_PATTERN

    def get_queryset(self) -> Any:
        executions = Execution.objects.all()
        if self.schema_only:
            return executions.none()
        if self.action == "list":
            filters = ExecutionFilters.parse(self.request)
            executions = (
                executions.with_status(filters.get("status"))
                .of_reactor(filters.get("reactor"))
                .created_between(filters.get("created_after"), filters.get("created_before"))
            )
        # a total order, so pages never overlap or skip rows
        return executions.order_by("-created_at", "-id")

    def get_serializer_class(self) -> Any:
        if self.action == "cancel":
            return CancelSerializer
        return ExecutionDetailSerializer if self.action == "retrieve" else ExecutionSerializer

    @extend_schema(
        summary="An execution's step runs, oldest first, paged",
        responses={200: StepRunSerializer(many=True), 400: BAD_PARAMETERS, 403: NOT_ALLOWED},
    )
    # drf-spectacular's own inspector, not the project's default (see extend_schema_view)
    @action(detail=True, methods=["get"], url_path="step-runs", schema=AutoSchema)
    def step_runs(self, request: Request, pk: str | None = None) -> Response:
        execution = self.get_object()  # 404 for an unknown id
        rows = StepRun.objects.for_execution(execution.pk).order_by("started_at", "id")
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(StepRunSerializer(page, many=True).data)

    @extend_schema(
        summary="Cancel an execution",
        description=(
            "Records the request and returns at once; the rollback never runs in this request. "
            "An execution that runs on workers (pending, parked, interrupted) is ended by a "
            "worker delivery, a running one at its next step boundary or checkpoint: the "
            "answer is then 202 with the execution's current status. A body that completed "
            "before the cancel was seen is undone (not compensated) with the other completed "
            "steps, newest first; a parallel map's elements that have not started never "
            "start. An interrupted execution of a reactor that runs in the caller has no "
            "worker to end it: it ends `cancelled` in this request (200). A second cancel "
            "keeps the first one's reason and is recorded as an event of its own. Needs the "
            "`reactor_app.cancel_execution` permission."
        ),
        request=CancelSerializer,
        responses={
            200: ExecutionSerializer,
            202: ExecutionSerializer,
            400: OpenApiResponse(ErrorSerializer, description="an invalid body"),
            403: NOT_ALLOWED,
            404: OpenApiResponse(ErrorSerializer, description="no such execution"),
            409: OpenApiResponse(ErrorSerializer, description="the execution has already ended"),
            503: OpenApiResponse(ErrorSerializer, description="Redis unreachable"),
        },
    )
    # drf-spectacular's own inspector, not the project's default (see extend_schema_view)
    @action(detail=True, methods=["post"], schema=AutoSchema)
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        if not request.user.has_perm("reactor_app.cancel_execution"):
            raise PermissionDenied("cancelling needs the reactor_app.cancel_execution permission")
        execution = self.get_object()  # 404 for an unknown id
        body = CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            row = cancel_execution(
                execution.pk, body.validated_data["reason"], by=request.user.get_username()
            )
        except ExecutionNotCancellable as exc:
            return Response(
                {"detail": exc.message, "status": exc.fields()["status"]},
                status=status.HTTP_409_CONFLICT,
            )
        except InputValidationError as exc:
            raise ValidationError({"reason": [exc.message]}) from exc
        except CoordinationUnavailable as exc:
            raise CoordinationStoreUnavailable(exc.message) from exc
        code = status.HTTP_200_OK if row.is_terminal else status.HTTP_202_ACCEPTED
        return Response(ExecutionSerializer(row).data, status=code)


@extend_schema_view(
    list=extend_schema(
        summary="Live holds (from Redis), each attributed to its step or to the reactor level",
        description=(
            "Read from the live-holds index one page at a time: oldest acquisition first, "
            "or in `ordering` (`acquired`, `-acquired`, `ttl`: least time left first, `-ttl`), "
            "or by key under `key_prefix`. Follow `next` for the following page (it keeps the "
            "ordering); `page_size` bounds a page."
        ),
        parameters=[HoldFilters],
        responses={
            200: HoldPageSerializer,
            400: BAD_PARAMETERS,
            403: NOT_ALLOWED,
            503: OpenApiResponse(ErrorSerializer, description="Redis unreachable"),
        },
    ),
)
class HoldViewSet(ReactorAPIMixin, viewsets.GenericViewSet):
    serializer_class = HoldSerializer
    pagination_class = None  # cursor paging over the live-holds index, below

    def get_queryset(self) -> Any:  # pragma: no cover - holds are not ORM rows
        return Execution.objects.none()

    def list(self, request: Request) -> Response:
        filters = HoldFilters.parse(request)
        if "execution" in filters:
            filters["execution"] = str(filters["execution"])
        raw_size = request.query_params.get("page_size")
        size = (
            ReactorPagination.page_size
            if raw_size is None
            else positive_int("page_size", raw_size, MAX_PAGE_SIZE)
        )
        try:
            page = live.hold_page(limit=size, **filters)
        except ValueError as exc:
            # the ordering and the filters were checked above: what is left is the cursor
            raise ValidationError({"cursor": [str(exc)]}) from exc
        except CoordinationUnavailable as exc:
            raise CoordinationStoreUnavailable(exc.message) from exc
        rows = page.rows
        statuses = Execution.objects.statuses_of([h["execution"] for h in rows])
        for hold in rows:
            hold["execution_status"] = statuses.get(hold["execution"] or "")
        next_url = None
        if page.next_cursor is not None:
            next_url = replace_query_param(request.build_absolute_uri(), "cursor", page.next_cursor)
        return Response(
            {
                "count": page.count,
                "totals": page.totals,
                "next": next_url,
                "previous": None,
                "results": HoldSerializer(rows, many=True).data,
            }
        )


@extend_schema_view(
    list=extend_schema(
        summary="Coordination events (acquired, released, parked, forced release, ...)",
        parameters=[EventFilters],
        responses={
            200: CoordinationEventSerializer(many=True),
            400: BAD_PARAMETERS,
            403: NOT_ALLOWED,
        },
    ),
    retrieve=extend_schema(summary="One coordination event"),
)
class EventViewSet(ReactorAPIMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = CoordinationEventSerializer
    lookup_value_regex = r"[0-9]+"

    def get_queryset(self) -> Any:
        events = CoordinationEvent.objects.all()
        if self.schema_only:
            return events.none()
        if self.action == "list":
            filters = EventFilters.parse(self.request)
            events = events.matching(**filters)
        return events.order_by("-at", "-id")


@extend_schema_view(
    list=extend_schema(
        summary="Parked executions and what blocks them (parked is never a failure)",
        parameters=[ContentionFilters],
        responses={
            200: ContentionSerializer(many=True),
            400: BAD_PARAMETERS,
            403: NOT_ALLOWED,
        },
    ),
    retrieve=extend_schema(summary="One parked execution's contention record"),
)
class ContentionViewSet(ReactorAPIMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = ContentionSerializer
    lookup_value_regex = r"[0-9]+"

    def get_queryset(self) -> Any:
        rows = ContentionState.objects.active()
        if self.schema_only:
            return rows.none()
        if self.action == "list":
            rows = rows.matching(**ContentionFilters.parse(self.request))
        return rows.newest_first()


LIMIT_WRITTEN = {
    200: LimitSerializer,
    400: OpenApiResponse(ErrorSerializer, description="an invalid body"),
    403: OpenApiResponse(ErrorSerializer, description="without reactor_app.override_limit"),
    503: OpenApiResponse(ErrorSerializer, description="saved, but Redis unreachable"),
}


@extend_schema_view(
    list=extend_schema(
        summary="Named limits: the value in force and its origin (settings or an override)",
        responses={
            200: LimitSerializer(many=True),
            403: NOT_ALLOWED,
            503: OpenApiResponse(ErrorSerializer, description="Redis unreachable"),
        },
    ),
    create=extend_schema(
        summary="Override a named limit live (every process within 1 s)",
        request=LimitOverrideSerializer,
        responses=LIMIT_WRITTEN,
    ),
)
class LimitViewSet(ReactorAPIMixin, viewsets.GenericViewSet):
    """Live limits (docs/coordination.md, "Live limits"); changing one needs the
    ``reactor_app.override_limit`` permission and is audited (``limit_changed`` events)."""

    serializer_class = LimitSerializer
    pagination_class = None  # a handful of names from settings

    def get_queryset(self) -> Any:  # pragma: no cover - limits are not listed from a queryset
        return Execution.objects.none()

    def list(self, request: Request) -> Response:
        try:
            rows = [limit.as_dict() for limit in limits.named_limits()]
        except CoordinationUnavailable as exc:
            raise CoordinationStoreUnavailable(exc.message) from exc
        return Response(LimitSerializer(rows, many=True).data)

    def _named(self, primitive: str, name: str) -> Response:
        found = [
            lim for lim in limits.named_limits() if (lim.primitive, lim.name) == (primitive, name)
        ]
        return Response(LimitSerializer(found[0].as_dict()).data if found else {})

    def _change(self, request: Request, *, setting: bool) -> Response:
        if not request.user.has_perm("reactor_app.override_limit"):
            raise PermissionDenied(
                "overriding a limit needs the reactor_app.override_limit permission"
            )
        body = LimitOverrideSerializer(data=request.data, context={"setting": setting})
        body.is_valid(raise_exception=True)
        data, by = body.validated_data, request.user.get_username()
        try:
            if setting:
                limits.set_override(
                    data["primitive"], data["name"], data["parsed"], by=by, reason=data["reason"]
                )
            else:
                limits.remove_override(
                    data["primitive"], data["name"], by=by, reason=data["reason"]
                )
            return self._named(data["primitive"], data["name"])
        except limit_input.InvalidLimit as exc:
            raise ValidationError({"value": [str(exc)]}) from exc
        except CoordinationUnavailable as exc:
            raise CoordinationStoreUnavailable(exc.message) from exc

    def create(self, request: Request) -> Response:
        return self._change(request, setting=True)

    @extend_schema(
        summary="Remove a named limit's override (back to settings)",
        request=LimitOverrideSerializer,
        responses=LIMIT_WRITTEN,
    )
    @action(detail=False, methods=["post"], schema=AutoSchema)
    def remove(self, request: Request) -> Response:
        return self._change(request, setting=False)
