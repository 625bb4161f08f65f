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
# Format characters a reason may hold: the joiners some scripts need to be written at all.
JOINERS = frozenset("\u200c\u200d")
# Letters and symbols that draw nothing: Hangul fillers, the blank braille pattern, and
# the Khmer inherent vowels Unicode advises against (they rendered a reason invisible).
BLANK_LOOKALIKES = frozenset("\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5")


def refuse_control_characters(text: str) -> None:
    """A validator (Django forms and DRF both run it): no control character (a tab, which a
    paste into the page's field keeps, is one the logs and the CSV take), no line or
    paragraph separator, and no format character but the joiners: directional marks and
    overrides reorder what a reader sees, and tag characters carry text no one sees."""
    for char in text:
        category = unicodedata.category(char)
        if (category in ("Cc", "Zl", "Zp") and char != "\t") or (category == "Cf" and char not in JOINERS) or char in BIDI_CONTROLS:
            raise ValidationError(f"must be one line of text without control characters (found U+{ord(char):04X})")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` shows anything: a letter, digit, punctuation mark or symbol that
    draws something (not only spaces, marks, fillers or format characters)."""
    return any(unicodedata.category(char)[0] in "LNPS" and char not in BLANK_LOOKALIKES for char in text)
