"""The API's JSON parser: DRF's, with nesting too deep for the decoder and repeated keys
refused as 400s.

Python's json module recurses once per level of nesting and raises RecursionError (not a
ValueError, which DRF turns into a 400) at about a thousand levels: a 6 KB body of
brackets answered 500. A body that deep is never a valid request to this API.

An object naming a key twice (``{"weight": 1, "weight": 100}``) took the last value in
silence, where a proxy or a client library in front may read the first: what was checked
there and what is done here would differ. RFC 8259 leaves such an object's meaning open;
here it is refused, naming the key.

A charset other than UTF-8 is a 415: under ``utf-7`` or ``unicode_escape`` the API read
other text than a proxy in front that reads the bytes as JSON's UTF-8 (RFC 8259 §8.1).
"""

from __future__ import annotations

import codecs

from rest_framework import parsers
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.utils import json

TOO_DEEP = "JSON parse error - nested too deeply"
SHOWN_KEY_CHARS = 40


def read_as_utf8(encoding: str) -> bool:
    """A charset whose text is UTF-8's: UTF-8 itself, or ASCII, its subset (read alike)."""
    try:
        return codecs.lookup(encoding).name in ("utf-8", "ascii")
    except LookupError:
        return False


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        if not read_as_utf8(encoding):
            raise UnsupportedMediaType(media_type, f"JSON is read as UTF-8 only (RFC 8259), not charset={encoding}.")
        try:
            return json.load(codecs.getreader(encoding)(stream), parse_constant=json.strict_constant,
                             object_pairs_hook=one_value_per_key)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def one_value_per_key(pairs: list[tuple[str, object]]) -> dict:
    found = dict(pairs)
    if len(found) < len(pairs):
        seen = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {repeated[:SHOWN_KEY_CHARS]!r} appears more than once in one object")
    return found
