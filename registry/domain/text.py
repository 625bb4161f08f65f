"""What people type that others read on pages and in the audit timeline: a description
of several lines, and a model's name, which becomes a path on every worker.

A description of ESC sequences was stored and shown as typed, and a directional override
(U+202E) shows other text than is stored, on the model's page and in the audit event
that copies it; reasons had refused both since registry/domain/reasons.py."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from registry.domain.reasons import refuse_unseen_characters

LINE_BREAKS = frozenset("\t\n\r")  # a textarea's own, kept
# The worker's /v2/models/stats answers every model's statistics (Triton's route).
RESERVED_MODEL_NAMES = {"stats": "a worker's /v2/models/stats answers every model's statistics, so a model of that name could not be described"}


def refuse_hidden_characters(text: str) -> None:
    """A validator of text of several lines: tabs and line breaks stay; what else
    reasons.py refuses in one line is refused here too."""
    refuse_unseen_characters(text, keep=LINE_BREAKS, controls_refused="must not hold control characters or directional overrides")


def refuse_reserved_model_name(name: str) -> None:
    why = RESERVED_MODEL_NAMES.get(name.lower())  # names differing only by case are one name to the catalogue
    if why is not None:
        raise ValidationError(f"{name!r} is reserved: {why}")
