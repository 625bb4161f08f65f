"""Django upload handlers: who may put bytes in the artifact store, and when.

Django parses a multipart body the first time anything reads ``request.POST`` (the CSRF
middleware does, before any view has checked who is asking). So the handler every
request gets by default (``FILE_UPLOAD_HANDLERS``) writes file parts nowhere; only the
two upload endpoints, once they have authenticated the caller and checked the role
from the headers and cookies, swap in ``StagingUploadHandler`` and parse. The endpoint
then calls ``discard()`` in a ``finally``: every file the handler started is removed,
finished or not, unless it was committed into the store meanwhile.
"""

from __future__ import annotations

import copy

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, SkipFile, StopUpload
from django.http import HttpRequest, QueryDict
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.datastructures import MultiValueDict

from registry.artifacts import storage

# Room for the multipart framing and the small text fields (description, CSRF token)
# that travel beside the artifact; a body past limit + this is refused unread.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class StagedUploadedFile(UploadedFile):
    """An uploaded file whose bytes are already staged and hashed."""

    def __init__(self, staged: storage.StagedArtifact, name: str, content_type: str | None):
        super().__init__(open(staged.path, "rb"), name, content_type, staged.size_bytes)
        self.staged = staged

    def temporary_file_path(self) -> str:
        return str(self.staged.path)


class FileFieldsRefused(FileUploadHandler):
    """The default for every request: text fields parse, file parts are read past and
    dropped, so a request nobody has authenticated yet cannot write to disk."""

    def new_file(self, *args, **kwargs):
        raise SkipFile()

    def receive_data_chunk(self, raw_data, start):
        return None

    def file_complete(self, file_size):
        return None


class StagingUploadHandler(FileUploadHandler):
    """Streams file parts into the store's staging folder while hashing them, and stops
    reading the body once the size limit is passed."""

    def __init__(self, request=None, max_bytes: int | None = None):
        super().__init__(request)
        self.max_bytes = settings.MAX_UPLOAD_BYTES if max_bytes is None else max_bytes
        self.writers: list[storage.StagingWriter] = []
        self.files: list[StagedUploadedFile] = []

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.writer = storage.StagingWriter(self.max_bytes)
        self.writers.append(self.writer)

    def receive_data_chunk(self, raw_data, start):
        try:
            self.writer.write(raw_data)
        except storage.UploadTooLarge:
            # Remembered on the request so the view can name the problem (413); the
            # rest of the body is left unread.
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=True)

    def file_complete(self, file_size):
        uploaded = StagedUploadedFile(self.writer.finish(), self.file_name, self.content_type)
        self.files.append(uploaded)
        return uploaded

    def upload_interrupted(self):
        if hasattr(self, "writer"):
            self.writer.abort()

    def discard(self) -> None:
        """Remove every staged file of this request (committed ones have moved away)."""
        for uploaded in self.files:
            uploaded.close()
        for writer in self.writers:
            writer.abort()


def declared_too_large(request: HttpRequest, max_bytes: int | None = None) -> bool:
    """A Content-Length past the upload limit (``MAX_UPLOAD_BYTES`` unless another is
    given): refused before one byte is read."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False  # the server refuses malformed lengths before we see them
    return declared > (settings.MAX_UPLOAD_BYTES if max_bytes is None else max_bytes) + MULTIPART_OVERHEAD_BYTES


def start_staging(request: HttpRequest, max_bytes: int | None = None) -> StagingUploadHandler:
    """Only after authentication and the role check: from here file parts are staged
    (each up to ``max_bytes``, default ``MAX_UPLOAD_BYTES``). Raises AttributeError when
    something has parsed the body already."""
    handler = StagingUploadHandler(request, max_bytes)
    request.upload_handlers = [handler]
    return handler


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def csrf_failure_from_headers(request: HttpRequest) -> str | None:
    """Django's own CSRF check, run on the headers and cookies alone (the token must come
    in ``X-CSRFToken``), so a forged upload is refused before its body is read. Returns
    the reason it failed, or None."""
    probe = copy.copy(request)
    probe._post, probe._files = QueryDict(), MultiValueDict()  # so the real body stays unread
    return _CsrfCheck(lambda _request: None).process_view(probe, None, (), {})


def csrf_failure(request: HttpRequest) -> str | None:
    """The whole check, token from the form included: this parses the body."""
    return _CsrfCheck(lambda _request: None).process_view(request, None, (), {})
