"""Page-number pagination whose bad parameters are 400s, not 404s or silent fallbacks.

DRF answers a page past the end with 404 and ignores a malformed ``page_size``; an operator
script that sends ``page=abc`` or ``page_size=100000`` deserves to be told what is wrong.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import InvalidPage
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def positive_int(name: str, raw: str, maximum: int | None = None) -> int:
    bound = f" between 1 and {maximum}" if maximum else " of at least 1"
    try:
        number = int(raw)
    except (TypeError, ValueError):
        raise ValidationError(
            {name: [f"{raw!r} is not a whole number; use a number{bound}"]}
        ) from None
    if number < 1 or (maximum is not None and number > maximum):
        raise ValidationError({name: [f"{number} is out of range; use a number{bound}"]})
    return number


class ReactorPagination(PageNumberPagination):
    page_size = DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    last_page_strings = ()  # "page=last" is not part of the contract

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        return positive_int(self.page_size_query_param, raw, self.max_page_size)

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        raw = request.query_params.get(self.page_query_param)
        number = positive_int(self.page_query_param, raw) if raw is not None else 1
        try:
            return super().paginate_queryset(queryset, request, view)
        except (NotFound, InvalidPage):
            pages = self.django_paginator_class(queryset, self.get_page_size(request)).num_pages
            raise ValidationError(
                {self.page_query_param: [f"page {number} does not exist; the last page is {pages}"]}
            ) from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["maximum"] = self.max_page_size
        return parameters
