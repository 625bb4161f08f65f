"""A database that cannot be reached is a 503 with ``Retry-After``, never a 500.

Django turns every exception into handler500's answer, and ours used to crash there too:
the page's context processors read ``request.user``, which loads the session from the
database that had just failed. Here a database error becomes an answer that needs no
database at all: JSON for ``/api/``, a standalone page elsewhere (no context processors,
no session, no user).

Two entry points share one answer. ``DatabaseOutageMiddleware.process_exception`` sees
what a view raises (DRF's handler passes database errors through; a lazy ``request.user``
evaluated in a view or while a template renders fails there too), in DEBUG as well.
``console.views.server_error`` covers errors raised inside other middleware, which
Django converts to handler500's answer before any outer middleware could see them.

Which errors count, an unreachable database or one that refuses writes, is
``registry.db_unavailable``'s to say (the drills judge errors by it too).
"""

from __future__ import annotations

import logging
import uuid

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin

from registry.committed_change import change_in_doubt, committed_change
from registry.db_unavailable import is_database_unavailable, is_disk_full, is_lock_timeout, is_read_only, past_file_size_limit

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
MESSAGE = f"the database is unavailable; retry in {RETRY_AFTER_S} s"
READ_ONLY_MESSAGE = f"the database accepts no writes now (read-only); retry in {RETRY_AFTER_S} s"
DISK_FULL_MESSAGE = "the disk holding the console's database is full: nothing was changed; free space on it and the console goes on by itself"
FILE_LIMIT_MESSAGE = ("the console's database could not grow its file: disk I/O error under a file size limit of {limit} bytes "
                      "(ulimit -f, LimitFSIZE=); nothing was changed; raise or lift the limit and restart the console")
LOCK_MESSAGE = (f"the database is busy: a lock this request needs was held by another session for longer than "
                f"DATABASE_LOCK_TIMEOUT_S; nothing was changed; retry in {RETRY_AFTER_S} s")


def database_unavailable_response(request, error: BaseException) -> HttpResponse:
    """The 503 for ``request``; logs the reason (the client gets none: it would name
    the database's host) under a request id the body repeats."""
    request_id = uuid.uuid4().hex
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    committed = committed_change(request)
    in_doubt = None if committed else change_in_doubt(request)
    limit = past_file_size_limit(error)
    logger.warning("database unavailable on %s %s (request %s%s): %s: %s", request.method, request.path, request_id,
                   f", after committing {committed}" if committed else "", type(error).__name__, reason)
    if committed:
        response = _committed_response(request, committed, request_id)
    elif in_doubt:
        response = _in_doubt_response(request, in_doubt, request_id)
    elif is_disk_full(error):  # 507, no Retry-After: waiting alone mends nothing
        response = _disk_full_response(request, request_id)
    elif limit is not None:  # nor here
        response = _disk_full_response(request, request_id, limit)
    elif request.path.startswith("/api/"):
        message = READ_ONLY_MESSAGE if is_read_only(error) else LOCK_MESSAGE if is_lock_timeout(error) else MESSAGE
        response = JsonResponse({"error": message, "request_id": request_id}, status=503)
    else:
        context = {"retry_after_s": RETRY_AFTER_S, "request_id": request_id, "read_only": is_read_only(error)}
        response = HttpResponse(render_to_string("503.html", context), status=503)
    no_wait_mends = is_disk_full(error) or limit is not None
    if not (committed or in_doubt or no_wait_mends):
        response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    # Read by the console's handler: while the database cannot be reached, a request
    # refused for want of a slot is told that, not that the console is busy.
    response.database_unreachable = not (is_read_only(error) or is_lock_timeout(error) or no_wait_mends)
    return response


def _disk_full_response(request, request_id: str, file_limit: int | None = None) -> HttpResponse:
    """``file_limit``: the database's file reached the console's file size limit (that many bytes), not a full disk."""
    if request.path.startswith("/api/"):
        message = DISK_FULL_MESSAGE if file_limit is None else FILE_LIMIT_MESSAGE.format(limit=file_limit)
        return JsonResponse({"error": message, "request_id": request_id}, status=507)
    context = {"request_id": request_id, "disk_full": True, "file_limit": file_limit}
    return HttpResponse(render_to_string("503.html", context), status=507)


def _committed_response(request, committed: str, request_id: str) -> HttpResponse:
    """No Retry-After: this request's change is made, only its answer is incomplete."""
    if request.path.startswith("/api/"):
        message = (f"the change was made ({committed}), but the database became unavailable before this answer was complete: "
                   "do not repeat it")
        return JsonResponse({"error": message, "committed": committed, "request_id": request_id}, status=503)
    return HttpResponse(render_to_string("503_committed.html", {"committed": committed, "request_id": request_id}), status=503)


def _in_doubt_response(request, change: str, request_id: str) -> HttpResponse:
    """The connection went during this request's COMMIT: the change may have been made."""
    message = (f"the database failed while this change was being committed ({change}): it may or may not have been made; "
               "read the model's release history once the database answers, before repeating it")
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message, "in_doubt": change, "request_id": request_id}, status=503)
    return HttpResponse(render_to_string("503_committed.html", {"in_doubt": change, "request_id": request_id}), status=503)


class DatabaseOutageMiddleware(MiddlewareMixin):
    """Answers 503 for a database error raised by a view or its template. Listed before
    the session and authentication middleware, so their answers wrap this one.
    MiddlewareMixin keeps it async-capable: no thread hop per request under ASGI."""

    def process_exception(self, request, exception):
        if is_database_unavailable(exception):
            return database_unavailable_response(request, exception)
        return None
