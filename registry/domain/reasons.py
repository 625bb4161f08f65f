"""The reason a person types with an action: one line of text, kept in the audit timeline,
its CSV export and the logs.

A reason of ESC sequences (``"\\x1b[2J"``) was stored as typed, and a bidirectional override
shows text other than what is stored; and a forced change "with a reason" passed with
only a zero-width space, which ``str.strip`` keeps."""

from __future__ import annotations

import re
import unicodedata

from django.core.exceptions import ValidationError

from serving.contract import NOT_IN_A_LINE

# Tag characters carry text no one sees, but for an emoji flag's tag sequence (Scotland's).
EMOJI_TAG_SEQUENCE = re.compile("\U0001F3F4[\U000E0020-\U000E007E]+\U000E007F")
TAGS = re.compile("[\U000E0000-\U000E007F]")
# Letters and symbols that draw nothing: Hangul fillers and the blank braille pattern
# (a forced reason of one passed).
BLANK_LOOKALIKES = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def refuse_unseen_characters(text: str, *, keep: frozenset[str], controls_refused: str) -> None:
    """Refuse a control character not in ``keep``, a line or paragraph separator, a
    directional override, or a tag character outside an emoji flag (hidden text), with
    ``controls_refused`` saying what the field must be. Soft hyphens, joiners and
    directional marks stay: real text has them."""
    for char in text:
        # serving.contract's set (the control characters, the line and paragraph separators,
        # the explicit directional embeddings, overrides and isolates of UAX #9, which reorder
        # what a reader sees), and a tab or a line feed: one checker for all text people read.
        if char not in keep and NOT_IN_A_LINE.match(char):
            raise ValidationError(f"{controls_refused} (found U+{ord(char):04X})")
    hidden = TAGS.search(EMOJI_TAG_SEQUENCE.sub("", text))
    if hidden:
        raise ValidationError(f"must not hold tag characters outside an emoji flag: they carry text no one sees (found U+{ord(hidden.group()):04X})")


def refuse_control_characters(text: str) -> None:
    """A validator of one line (Django forms and DRF both run it). A tab, which a paste into
    the page's field keeps, stays: the logs and the CSV take it."""
    refuse_unseen_characters(text, keep=frozenset("\t"),
                             controls_refused="must be one line of text without control characters or directional overrides")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` shows anything: a letter, digit, punctuation mark or symbol that
    draws something (not only spaces, marks, fillers or format characters)."""
    return any(unicodedata.category(char)[0] in "LNPS" and char not in BLANK_LOOKALIKES for char in text)
