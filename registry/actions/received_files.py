"""Files sent to the console for a job or a data set: streamed into the artifact store's
staging folder (hashed and counted as they come, never held in memory, refused once
past their limit), checked cheaply, then moved into place by the caller.

An upload that an upload endpoint staged already (``StagedUploadedFile``) is taken as it
is; any other Django ``UploadedFile`` (the console's forms) is copied chunk by chunk.
"""

from __future__ import annotations

from pathlib import Path

from registry.artifacts import storage


class Refused(Exception):
    """A file that is not accepted; ``status`` is the HTTP answer, nothing was kept."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def extension(upload, allowed: tuple[str, ...], what: str, refusal: type[Refused]) -> str:
    """The file format named by the upload's file name, one of ``allowed``."""
    name = getattr(upload, "name", None) or ""
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in allowed:
        dotted = [f".{each}" for each in allowed]
        listed = dotted[0] if len(dotted) == 1 else f"{', '.join(dotted[:-1])} or {dotted[-1]}"  # "a .npz, .jsonl file" read as a list
        shown = f"'{name[:60]}'" if name else "a file without a name"
        raise refusal(f"{what} must be a {listed} file (the file name's extension says which); got {shown}", 400)
    return suffix


def stage(upload, max_bytes: int, limit_setting: str, what: str, refusal: type[Refused]) -> storage.StagedArtifact:
    """The upload's bytes as a staged file; ``refusal(…, 413)`` past ``max_bytes``,
    ``refusal(…, 400)`` when empty. A refused upload leaves no staged file."""
    staged = getattr(upload, "staged", None)
    if not isinstance(staged, storage.StagedArtifact):
        staged = _copy(upload, max_bytes, limit_setting, what, refusal)
    if staged.size_bytes > max_bytes or staged.size_bytes == 0:
        storage.discard(staged)
        raise too_large(max_bytes, limit_setting, what, refusal) if staged.size_bytes else refusal(f"{what} is empty", 400)
    return staged


def _copy(upload, max_bytes: int, limit_setting: str, what: str, refusal: type[Refused]) -> storage.StagedArtifact:
    if upload.size is not None and upload.size > max_bytes:
        raise too_large(max_bytes, limit_setting, what, refusal)
    writer = storage.StagingWriter(max_bytes)
    try:
        for chunk in upload.chunks():
            writer.write(chunk)
    except storage.UploadTooLarge:
        raise too_large(max_bytes, limit_setting, what, refusal) from None
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def too_large(max_bytes: int, limit_setting: str, what: str, refusal: type[Refused] = Refused) -> Refused:
    return refusal(f"{what} is larger than the limit of {max_bytes} bytes ({limit_setting})", 413)
