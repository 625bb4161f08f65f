"""The reason a person types with an action: one line of text, kept in the audit timeline,
its CSV export and the logs.

A reason of ESC sequences (``"\\x1b[2J"``) was stored as typed, and a bidirectional override
shows text other than what is stored; and a forced change "with a reason" passed with
only a zero-width space, which ``str.strip`` keeps."""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError

# Unicode's explicit directional embeddings, overrides and isolates (UAX #9).
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def refuse_control_characters(text: str) -> None:
    """A validator (Django forms and DRF both run it): no control character (a tab, which a
    paste into the page's field keeps, is one the logs and the CSV take), no line or
    paragraph separator, no directional override."""
    for char in text:
        if (unicodedata.category(char) in ("Cc", "Zl", "Zp") and char != "\t") or char in BIDI_CONTROLS:
            raise ValidationError(f"must be one line of text without control characters (found U+{ord(char):04X})")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` shows anything: not only spaces and invisible format characters."""
    return any(not char.isspace() and unicodedata.category(char) not in ("Cc", "Cf") for char in text)
