"""Model tags: short lowercase labels ("fraud", "cv", "team-payments"), a handful per
model, for finding models on the Models page. Refused, never silently rewritten, so the
API answers exactly what it stored."""

from __future__ import annotations

import re

MAX_TAGS = 10
MAX_TAG_LENGTH = 32
TAG_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
_TAG = re.compile(r"[a-z0-9][a-z0-9._-]*")


class InvalidTags(ValueError):
    pass


def check_tags(value: object) -> list[str]:
    """The tags as given, or InvalidTags naming the first problem."""
    if not isinstance(value, list):
        raise InvalidTags("tags must be a list of strings")
    if len(value) > MAX_TAGS:
        raise InvalidTags(f"at most {MAX_TAGS} tags, got {len(value)}")
    for index, tag in enumerate(value):
        _check_tag(index, tag)
    if len(set(value)) != len(value):
        raise InvalidTags("each tag may appear once")
    return list(value)


def _check_tag(index: int, tag: object) -> None:
    if not isinstance(tag, str):
        raise InvalidTags(f"tags[{index}] must be a string")
    if not 1 <= len(tag) <= MAX_TAG_LENGTH:
        raise InvalidTags(f"tags[{index}] must be 1 to {MAX_TAG_LENGTH} characters long")
    if not _TAG.fullmatch(tag):
        raise InvalidTags(f"tags[{index}] {tag[:MAX_TAG_LENGTH]!r}: use lowercase letters, digits, '.', '_' and '-', starting with a letter or digit")


def parse_typed_tags(text: str) -> list[str]:
    """What a person typed in a form ("Fraud, cards") as tags to check: split on commas
    and spaces, lowercased, repeats dropped."""
    seen: dict[str, None] = {}
    for item in re.split(r"[\s,]+", text.strip().lower()):
        if item:
            seen.setdefault(item, None)
    return list(seen)
