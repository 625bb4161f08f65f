"""Text cells of a CSV that people open in a spreadsheet or a terminal.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula
(CSV injection); a terminal obeys ESC sequences and shows a right-to-left override as
reordered text. Both the audit export and a batch job's CSV output write text that
someone else chose (a reason typed by a person; an output name from a model file; a
client's bad field quoted in a row's error), so every such cell goes through ``csv_cell``,
and both files quote every text cell: written bare, ``ok;=1+1`` was split into a cell
starting with ``=`` by a spreadsheet whose list separator is ``;``. No Django here: the
batch job runner imports it.
"""

from __future__ import annotations

# OWASP's list, a line feed (a cell of its own once a reader splits lines), and the
# fullwidth forms some spreadsheets' East Asian input modes read as the ASCII ones.
# Looked for past leading spaces: an import that trims them (LibreOffice's "Trim spaces")
# runs " =1+1" as a formula.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
# C0 and C1 controls (tab and newline kept: the CSV quotes them), DEL, and the bidirectional
# overrides and isolates, each written as its code point (``\x1b`` → ``U+001B``).
LEADING_SPACES = " \u00a0\u3000"
TERMINAL_CONTROLS = {code: f"U+{code:04X}" for code in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0),
                                                          *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def csv_cell(value) -> str:
    """Text a spreadsheet shows as text, never runs as a formula, and a terminal shows as
    text, never obeys."""
    if value is None:
        return ""
    text = str(value).translate(TERMINAL_CONTROLS)
    return "'" + text if isinstance(value, str) and text.lstrip(LEADING_SPACES).startswith(FORMULA_PREFIXES) else text
