"""A Django upload handler that streams file fields into the artifact store's staging
folder while hashing them, and stops reading once the size limit is passed."""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopUpload

from registry import storage


class StagedUploadedFile(UploadedFile):
    """An uploaded file whose bytes are already staged and hashed."""

    def __init__(self, staged: storage.StagedArtifact, name: str, content_type: str | None):
        super().__init__(open(staged.path, "rb"), name, content_type, staged.size_bytes)
        self.staged = staged

    def temporary_file_path(self) -> str:
        return str(self.staged.path)


class HashingUploadHandler(FileUploadHandler):
    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.writer = storage.StagingWriter(settings.MAX_UPLOAD_BYTES)

    def receive_data_chunk(self, raw_data, start):
        try:
            self.writer.write(raw_data)
        except storage.UploadTooLarge:
            # Remembered on the request so the view can name the problem (413).
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=False)
        return None

    def file_complete(self, file_size):
        return StagedUploadedFile(self.writer.finish(), self.file_name, self.content_type)

    def upload_interrupted(self):
        if hasattr(self, "writer"):
            self.writer.abort()


def discard_staged_files(request) -> None:
    """After a view: staged bytes not moved into the store (refused uploads, fields the
    view did not use) are deleted. ``request`` is Django's HttpRequest."""
    files = getattr(request, "_files", None)
    for _, values in files.lists() if files is not None else []:
        for uploaded in values:
            if isinstance(uploaded, StagedUploadedFile):
                uploaded.close()
                storage.discard(uploaded.staged)
