"""Request body parsers of the renter API (DRF)."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class JsonParser(JSONParser):
    """DRF's JSON parser, with JSON nested past Python's recursion limit
    (``[[[[…]]]]``) a 400 like any other invalid JSON, not a 500: the
    completions answer it the same way (``jobs.views._request_parse``).

    Raises ParseError (400) for a body that is not JSON.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
