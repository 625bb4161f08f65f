"""The API's JSON parser: DRF's, with nesting too deep for the decoder refused as a 400.

Python's json module recurses once per level of nesting and raises RecursionError (not a
ValueError, which DRF turns into a 400) at about a thousand levels: a 6 KB body of
brackets answered 500. A body that deep is never a valid request to this API.
"""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError

TOO_DEEP = "JSON parse error - nested too deeply"


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
