"""Reading a model's audit timeline: the filters people apply to it (by kind, by person)
and its export as CSV, shared by the API and the model page so both refuse the same bad
values and write the same rows.

The export is read by spreadsheets, which execute a cell that starts with ``=``, ``+``,
``-`` or ``@`` as a formula (CSV injection): every text cell that starts with one of
those, or with a tab or carriage return, is prefixed with an apostrophe, which makes it
text. Messages and reasons are typed by people and so are hostile.

Every cell is quoted: written bare, ``ok;=1+1;@SUM(A1:A2)`` was split by a spreadsheet
whose list separator is ``;`` into cells starting with ``=`` and ``@``, which ran (only
the first character had been checked). Quoted, such a spreadsheet keeps the cell whole,
and the text people typed is exported as typed.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from registry.domain.choices import AuditKind
from registry.models import AuditEvent, RegisteredModel
from serving.spreadsheet_cells import csv_cell

CSV_HEADER = ["time", "kind", "actor", "generation", "rollout", "reason", "message"]
CSV_PAGE_ROWS = 500  # events read from the database at a time while streaming
SHOWN_PREFIX = 40  # of a refused value, in the error


class AuditFilterError(ValueError):
    """A filter value that names nothing; ``parameter`` is the query parameter."""

    def __init__(self, parameter: str, message: str):
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = f"{parameter}: {message}"


@dataclass(frozen=True)
class AuditFilter:
    kind: str = ""
    actor: str = ""

    @classmethod
    def parse(cls, query) -> AuditFilter:
        """From a request's query parameters; empty means no filter."""
        kind = (query.get("kind") or "").strip()
        actor = (query.get("actor") or "").strip()
        if kind and kind not in AuditKind.values:
            raise AuditFilterError("kind", f"no audit kind {kind[:SHOWN_PREFIX]!r}; one of {', '.join(AuditKind.values)}")
        if "\x00" in actor:  # PostgreSQL refuses NUL in a text parameter: the lookup below was a 500
            raise AuditFilterError("actor", "must not contain NUL (\\u0000) characters")
        if actor and not get_user_model().objects.filter(username=actor).exists():
            raise AuditFilterError("actor", f"no user named {actor[:SHOWN_PREFIX]!r}")
        return cls(kind=kind, actor=actor)

    @property
    def is_active(self) -> bool:
        return bool(self.kind or self.actor)

    def as_query(self) -> dict[str, str]:
        return {key: value for key, value in (("kind", self.kind), ("actor", self.actor)) if value}


NO_FILTER = AuditFilter()


def events(model: RegisteredModel, chosen: AuditFilter = NO_FILTER) -> QuerySet[AuditEvent]:
    """The model's events, newest first, narrowed to ``chosen``."""
    found = AuditEvent.objects.filter(model=model).select_related("actor")
    if chosen.kind:
        found = found.filter(kind=chosen.kind)
    if chosen.actor:
        found = found.filter(actor__username=chosen.actor)
    return found


def actors(model: RegisteredModel) -> list[str]:
    """Everyone who appears in the model's timeline, for the person filter."""
    # Ordered by the name alone: with the model's default ordering (by time) in the query,
    # DISTINCT kept one row per event, and the filter listed one person 80 times.
    names = AuditEvent.objects.filter(model=model, actor__isnull=False).order_by("actor__username").values_list("actor__username", flat=True)
    return list(names.distinct())


def reason(event: AuditEvent) -> str:
    """What the person typed with the action (releases and rollouts keep it)."""
    return str(event.data.get("reason") or "")


def generation_made(event: AuditEvent) -> int | None:
    """The generation a release event made, or a rollout event's release."""
    value = event.data.get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def csv_row(event: AuditEvent) -> list[str]:
    actor = event.actor.get_username() if event.actor else ""
    values = [event.created_at.isoformat(), event.kind, actor, generation_made(event), event.data.get("rollout"), reason(event), event.message]
    return [csv_cell(value) for value in values]


class _Line:
    """csv.writer's file: hands back each line it writes instead of keeping it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(found: Iterable[AuditEvent]) -> Iterator[str]:
    """The header, then one line per event: a generator, so a long timeline streams."""
    writer = csv.writer(_Line(), quoting=csv.QUOTE_ALL)
    yield writer.writerow(CSV_HEADER)
    for event in found:
        yield writer.writerow(csv_row(event))


def stream(found: QuerySet[AuditEvent]) -> Iterator[str]:
    """``found`` as CSV lines, newest first, read a page at a time by id: the first page
    now, while the request holds its slot (a database outage is then a 503, not a
    download cut short), the rest as they are sent. Each page is a query of its own, so
    no cursor or transaction stays open between them and the connection can be closed
    while a slow client reads; events written meanwhile have higher ids and are left
    out, so the export is the timeline as it stood when it began."""
    pages = _pages(found)
    first = next(pages, [])
    return csv_lines(itertools.chain.from_iterable(itertools.chain([first], pages)))


def _pages(found: QuerySet[AuditEvent]) -> Iterator[list[AuditEvent]]:
    newest_first = found.order_by("-id")
    page = list(newest_first[:CSV_PAGE_ROWS])
    while page:
        yield page
        if len(page) < CSV_PAGE_ROWS:
            return
        page = list(newest_first.filter(id__lt=page[-1].id)[:CSV_PAGE_ROWS])
