"""What people type that others read on pages and in the audit timeline: a description
of several lines, and a model's name, which becomes a path on every worker.

A description of ESC sequences was stored and shown as typed, and a directional override
(U+202E) shows other text than is stored, on the model's page and in the audit event
that copies it; reasons had refused both since registry/domain/reasons.py."""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError

from registry.domain.reasons import BIDI_CONTROLS, EMOJI_TAG_SEQUENCE, TAGS

LINE_BREAKS = frozenset("\t\n\r")  # a textarea's own, kept
# The worker's /v2/models/stats answers every model's statistics (Triton's route).
RESERVED_MODEL_NAMES = {"stats": "a worker's /v2/models/stats answers every model's statistics, so a model of that name could not be described"}


def refuse_hidden_characters(text: str) -> None:
    """A validator of text of several lines: tabs and line breaks stay; any other control
    character, a directional override or a tag character outside an emoji flag is refused.
    Directional marks, joiners and soft hyphens stay: real text has them."""
    for char in text:
        if (unicodedata.category(char) in ("Cc", "Zl", "Zp") and char not in LINE_BREAKS) or char in BIDI_CONTROLS:
            raise ValidationError(f"must not hold control characters or directional overrides (found U+{ord(char):04X})")
    hidden = TAGS.search(EMOJI_TAG_SEQUENCE.sub("", text))
    if hidden:
        raise ValidationError(f"must not hold tag characters outside an emoji flag: they carry text no one sees (found U+{ord(hidden.group()):04X})")


def refuse_reserved_model_name(name: str) -> None:
    why = RESERVED_MODEL_NAMES.get(name.lower())  # names differing only by case are one name to the catalogue
    if why is not None:
        raise ValidationError(f"{name!r} is reserved: {why}")
