"""Quoting what a peer sent inside an error message, bounded.

An error names the offending value so its sender can find it, but a message that echoes its
input whole lets anyone make a service write megabytes to its logs and replies (an address of
a million characters, a shape of thousands of dimensions). Every message that quotes input
goes through `quote`, so no error is much longer than the service's own words.
"""

from __future__ import annotations

QUOTE_LIMIT = 80  # characters of the input an error message may quote
_ELLIPSIS = "..."


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as a message quotes it: repr for a string (quotes, escapes), str otherwise; at most
    `limit` characters, cut with "..." (and the total length) when longer."""
    return shorten(repr(value) if isinstance(value, (str, bytes)) else str(value), limit)


def shorten(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` as is when it has at most `limit` characters, else its start, "..." and its length
    (for relaying a peer's own message, e.g. an error's details, which `quote` would put in quotes)."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - len(_ELLIPSIS), 0)]}{_ELLIPSIS} ({len(text)} characters)"
