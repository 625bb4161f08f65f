"""Pages of the lists that grow for as long as the console runs (audit events, releases,
drills, rollouts, versions, jobs), so that no answer is built from every row at once.

A list answers ``LIST_PAGE_SIZE`` items (``?limit=`` from 1 to ``LIST_MAX_PAGE_SIZE``)
and, when more follow, a ``Link: <…?cursor=…>; rel="next"`` header, as GitHub's API
does: the body stays the JSON array it always was, so a client that reads one page reads
it as before, and one that wants everything follows ``next`` until it is gone. The
cursor is DRF's: a position in the list's order, so a page is the same however many rows
arrive meanwhile (an offset would repeat or skip them), and reading any page costs one
indexed query however deep it is. Every order is by a column unique in the list (``id``
for "newest first"): DRF separates rows that share a position by an offset it caps at
1,000, and past that a client following ``next`` looped for ever (1,200 events given one
``created_at``), and ``prev`` skipped rows of a tie.

Hostile values are 400s that name the parameter: DRF answers a bad cursor with a bare
404 and ignores a bad ``limit``, and a cursor whose position is not a value of the
ordering field reached the database (a 500 on PostgreSQL). So is a query parameter the
list does not take: a misspelt ``?limt=`` or ``?actr=`` answered the first page of
everything, which reads as the filtered list.
"""

from __future__ import annotations

import binascii

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connections, models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.settings import api_settings

from registry.api.request_keys import MAX_NAMED, clip_key

LIST_PAGE_SIZE = 100
LIST_MAX_PAGE_SIZE = 1000
LIMIT_MESSAGE = f"must be a whole number from 1 to {LIST_MAX_PAGE_SIZE}"
CURSOR_MESSAGE = "is not a cursor this list gave out: follow the Link header's rel=\"next\" as it is"

PAGE_PARAMETERS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": LIST_MAX_PAGE_SIZE, "default": LIST_PAGE_SIZE},
                     description=f"Items on a page: 1 to {LIST_MAX_PAGE_SIZE} (default {LIST_PAGE_SIZE})."),
    OpenApiParameter("cursor", str, description="Where a page starts: copy it from the previous page's `Link` header, never build it."),
    OpenApiParameter("Link", OpenApiTypes.STR, location=OpenApiParameter.HEADER, response=[200],
                     description='`<URL>; rel="next"` when more items follow this page, `rel="prev"` when some come before it.'),
]


def refuse_unknown_query(request, filters=(), *, paged: bool = True) -> None:
    """A 400 naming each query parameter that is neither a page's (when ``paged``), DRF's
    ``format`` nor one of ``filters`` (the operation's documented OpenApiParameters)."""
    pages = ["limit", "cursor"] if paged else []
    takes = [*(parameter.name for parameter in filters), *pages, api_settings.URL_FORMAT_OVERRIDE]
    unknown = [name for name in request.query_params if name not in takes]
    if unknown:
        message = f"this list does not take this query parameter (it takes: {', '.join(dict.fromkeys(takes))})"
        raise exceptions.ValidationError({clip_key(name): [message] for name in unknown[:MAX_NAMED]})


class Pages(CursorPagination):
    """Newest first (the order rows were written) by default; a list whose order differs
    names it in a subclass. The ordering field is the cursor's position: unique among the
    list's rows and never changed once written."""

    page_size = LIST_PAGE_SIZE
    max_page_size = LIST_MAX_PAGE_SIZE
    page_size_query_param = "limit"
    ordering = ("-id",)
    template = None  # the browsable API's page controls would render every link twice
    query_filters = ()  # the list's own query parameters (OpenApiParameters); a view's ``query_filters`` wins

    def paginate_queryset(self, queryset, request, view=None):
        refuse_unknown_query(request, getattr(view, "query_filters", self.query_filters))
        self.queryset = queryset
        return super().paginate_queryset(queryset, request, view)

    def get_page_size(self, request):
        given = request.query_params.get(self.page_size_query_param)
        if given is None:
            return self.page_size
        # Its length first: int() of more than 4,300 digits raises (a 500 on every list).
        if not given.isascii() or not given.isdigit() or len(given) > len(str(self.max_page_size)) or not 1 <= int(given) <= self.max_page_size:
            raise exceptions.ValidationError({self.page_size_query_param: [LIMIT_MESSAGE]})
        return int(given)

    def decode_cursor(self, request):
        encoded = request.query_params.get(self.cursor_query_param)
        try:
            # DRF's decoding skips what is not base64, so "%%%" read as the first page.
            refused = encoded is not None and not binascii.a2b_base64(encoded.encode("ascii"), strict_mode=True)
            cursor = super().decode_cursor(request)
        except (exceptions.NotFound, ValueError):  # UnicodeError and binascii.Error are ValueErrors
            cursor, refused = None, True
        else:
            refused = refused or (cursor is not None and not self._is_position(cursor.position))
        if refused:
            raise exceptions.ValidationError({self.cursor_query_param: [CURSOR_MESSAGE]})
        return cursor

    def _is_position(self, position: str | None) -> bool:
        """Whether ``position`` is a value of the ordering field, as the cursor's filter
        will compare it: anything else would reach the database."""
        if position is None:
            return True
        field = self.queryset.model._meta.get_field(self.ordering[0].lstrip("-"))
        try:
            value = field.to_python(position)
            if isinstance(field, models.IntegerField):
                field.run_validators(value)  # the column's range: to_python takes any int
            # As the filter will convert it: SQLite's conversion of a time to UTC overflowed
            # on year 1 at +01:00 (a 500).
            field.get_db_prep_value(value, connections[self.queryset.db])
        except (DjangoValidationError, ValueError, TypeError, OverflowError):
            return False
        return "\x00" not in position

    def encode_cursor(self, cursor):
        # Relative to the request: an absolute link would be built from the Host header,
        # which behind a proxy names the proxy's upstream, not what the client called.
        self.base_url = self.request.get_full_path()
        return super().encode_cursor(cursor)

    def get_paginated_response(self, data):
        response = Response(data)
        links = [f'<{url}>; rel="{rel}"' for rel, url in (("next", self.get_next_link()), ("prev", self.get_previous_link())) if url]
        if links:
            response["Link"] = ", ".join(links)
        return response

    def get_paginated_response_schema(self, schema):
        return schema  # the body stays the list; the links travel in the Link header

    def get_schema_operation_parameters(self, view):
        return []  # PAGE_PARAMETERS, given with the operation's own, say it all


class ByGeneration(Pages):
    ordering = ("-generation",)


class ByNumber(Pages):
    ordering = ("-number",)


class ByName(Pages):
    ordering = ("name",)


class ByMinute(Pages):
    ordering = ("minute",)  # a version's figures read as a time series: oldest first


def page_of(request, queryset, pages: type[Pages] = Pages, filters=()):
    """``(items, paginator)`` for a view that is not a ListAPIView (``filters``: the
    query parameters it takes besides a page's); answer with
    ``paginator.get_paginated_response(serialized_items)``."""
    paginator = pages()
    paginator.query_filters = filters
    return paginator.paginate_queryset(queryset, request), paginator
