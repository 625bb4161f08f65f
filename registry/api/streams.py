"""Streamed answers (artifacts, job outputs, audit CSV) sent a part at a time under ASGI too.

Django's ASGI handler cannot pull a synchronous iterator from the event loop, so it
consumed one whole in a thread (`sync_to_async(list)`) before the first byte left: each
download of an artifact (up to MAX_UPLOAD_BYTES, 2 GiB) held the whole file in the
console's memory until it ended, a worker waited for the whole read before its download
began, and a few concurrent downloads could exhaust the console. Under ASGI,
`in_parts` hands the handler an asynchronous iterator instead, which takes a few parts
at a time from the synchronous one in a thread; a stream that reads the database as it
goes is sent by the console's handler with `in_hops`, which does the same under a slot
held only while its client keeps up. Under WSGI (the test client, `wsgi.py`)
Django already streams a synchronous iterator, and the response is left as it is.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, StreamingHttpResponse

from registry.artifacts import storage

FILE_PART_BYTES = 256 * 1024
FILE_PARTS_PER_HOP = 4  # a file download holds at most about 1 MiB of it at a time
LINES_PER_HOP = 256  # CSV lines are short: a trip to the thread costs more than a line


def file_response(request, path: Path, check: Callable[[Iterator[bytes], os.stat_result], Iterator[bytes]] | None = None,
                  **kwargs) -> FileResponse:
    """FileResponse of `path` (its length, name and type as FileResponse sets them), in
    parts; ``check`` sees every part as it is sent, with the opened file's status
    (``registry.artifacts.served_bytes``). A symbolic link is not followed (OSError):
    a link put in the store in place of an artifact streamed its target (/etc/passwd in
    an attack) to any reader."""
    opened = storage.open_unfollowed(path)
    response = FileResponse(opened, **kwargs)  # closed with the response
    response.block_size = FILE_PART_BYTES
    if check is not None:
        response.streaming_content = check(iter(response.streaming_content), os.fstat(opened.fileno()))
    # File reads need no database connection: any thread will do.
    return in_parts(request, response, FILE_PARTS_PER_HOP, thread_sensitive=False)


def database_stream(request, response: StreamingHttpResponse) -> StreamingHttpResponse:
    """``response``, whose parts are read from the database as it is sent (the audit CSV,
    a page of events per query). The console's handler sends it with ``in_hops``: a few
    parts at a time, under a slot of the streams kind held while its client keeps up and
    given back, its connection closed, while it reads slowly (``console.stream_slot``)."""
    response.reads_database_while_sent = True
    return response


def reads_database_while_sent(response) -> bool:
    """Whether a streamed ``response`` came from ``database_stream``: a file's, or a static
    file's, needs no connection while it is sent."""
    return getattr(response, "reads_database_while_sent", False)


def in_hops(response: StreamingHttpResponse, slot) -> StreamingHttpResponse:
    """``response`` (a ``database_stream``), its content taken ``LINES_PER_HOP`` parts at a
    time on its request's thread, each take under ``slot`` (``console.stream_slot.StreamSlot``)."""
    if not response.is_async:
        response.streaming_content = _from_thread(iter(response.streaming_content), LINES_PER_HOP, True, slot)
    return response


def in_parts(request, response: StreamingHttpResponse, per_hop: int = LINES_PER_HOP,
             thread_sensitive: bool = True) -> StreamingHttpResponse:
    """`response`, its content handed to the ASGI handler `per_hop` parts at a time. A
    database cursor must stay on its connection's thread: `thread_sensitive` unless the
    iterator reads only files."""
    if isinstance(getattr(request, "_request", request), ASGIRequest) and not response.is_async:
        response.streaming_content = _from_thread(iter(response.streaming_content), per_hop, thread_sensitive)
    return response


async def _from_thread(parts: Iterator[bytes], per_hop: int, thread_sensitive: bool, slot=None) -> AsyncIterator[bytes]:
    take = sync_to_async(lambda: list(itertools.islice(parts, per_hop)), thread_sensitive=thread_sensitive)
    if slot is None:
        while batch := await take():
            for part in batch:
                yield part
        return
    error = None
    try:
        while True:
            await slot.before_take()
            batch = await take()
            slot.after_take()
            if not batch:
                return
            for part in batch:
                yield part
    except BaseException as failure:  # noqa: B036 (GeneratorExit and cancellation end it too; re-raised)
        error = failure
        raise
    finally:
        await slot.finish(error)
