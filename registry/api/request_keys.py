"""Request bodies name only what their endpoint takes.

DRF drops a key its serializer does not declare, and keeps the last of a repeated
multipart part. A misspelt ``expected_generaton`` then skipped the stale-page check of a
traffic change, a rollout's ``stepz`` started the default plan, and of two ``artifact``
parts the second was uploaded. Each is a 400 naming the key and what the request takes.
"""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers

# Django's CSRF check reads this multipart field: a browser form may send it to any endpoint.
CSRF_FIELD = "csrfmiddlewaretoken"
MAX_NAMED = 10  # keys named in one refusal


def clip_key(key: object) -> str:
    """A client's key as an error names it: at most 80 characters."""
    text = str(key)
    return text if len(text) <= 80 else text[:80] + "…"


# Mixed into a serializer that reads a request body (before DRF's own class). A comment,
# not a docstring: the API schema took it for the description of every such serializer.
class RefusesUnknownKeys:

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            takes = [name for name, field in self.fields.items() if not field.read_only]
            unknown = [key for key in data if key not in takes and key != CSRF_FIELD]
            if unknown:
                message = f"this request does not take this field (it takes: {', '.join(takes)})"
                raise serializers.ValidationError({clip_key(key): [message] for key in unknown[:MAX_NAMED]})
            counts = {name: len(data.getlist(name)) for name in takes} if hasattr(data, "getlist") else {}  # multipart
            repeated = {name: count for name, count in counts.items() if count > 1}
            if repeated:
                raise serializers.ValidationError({name: [f"given {count} times: send it once"] for name, count in repeated.items()})
        return super().to_internal_value(data)
