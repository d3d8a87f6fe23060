r"""JSON values as packshard reads them: duplicate keys refused, a value's end found unparsed.

``json`` keeps the last of two equal keys, so ``{"role": "user", "role": "assistant"}`` would
silently become an assistant turn.  :data:`DECODER` builds every object through a hook that
refuses a repeated key (:class:`DuplicateKeyError`); the record is rejected as
``duplicate_key`` instead.

An unusable array element (too deep, too many digits, a duplicate key, too large) is
rejected and reading goes on, so its end must be found without parsing it.
:class:`ValueScanner` walks the text with two regular expressions and keeps its state between
calls: an element arriving in pieces is skipped in O(size) time and O(piece) memory::

    [ {"a": [[[[ … 100k levels … ]]]]} , {"messages": …} ]
      ^ depth 1 ... depth 100k ... 0 ^   ^ parsing resumes here

JSON can spell a lone surrogate (``"\ud800"``), which no UTF-8 text holds:
:func:`is_encodable` tells the text a record may carry from the text it may not.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

_STRUCTURE = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[\s,\]}]")


class DuplicateKeyError(ValueError):
    """A JSON object holds the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r} in a JSON object")
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return value


DECODER = json.JSONDecoder(object_pairs_hook=_unique_object)
"""The decoder of every JSON record: like ``json.loads``, but a repeated key raises."""


def parse_record(text: str) -> tuple[Any, tuple[str, str] | None]:
    """Parse one JSONL line: ``(value, None)``, or ``(None, (code, reason))``."""
    try:
        return DECODER.decode(text), None
    except json.JSONDecodeError as exc:
        why = f"invalid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"
        return None, ("invalid_json", why)
    except (ValueError, RecursionError) as exc:
        return None, unusable_reason(exc)


def too_large_reason(what: str, limit: int) -> tuple[str, str]:
    """Return ``(code, reason)`` of a ``what`` (line, element, row) over ``--max-record-bytes``."""
    return "too_large", (
        f"{what} is larger than {limit:,} bytes (use --max-record-bytes to raise the limit "
        "for records this large)"
    )


def unusable_reason(exc: ValueError | RecursionError) -> tuple[str, str]:
    """Return ``(code, reason)`` of a value that is JSON but cannot be read as a record.

    A repeated key, nesting past Python's recursion limit, or (another ``ValueError``) an
    integer with more digits than Python converts.
    """
    if isinstance(exc, DuplicateKeyError):
        why = "json would silently keep the last value; fix the record"
        return "duplicate_key", f"duplicate key {exc.key!r} in a JSON object ({why})"
    if isinstance(exc, RecursionError):
        return "invalid_json", "invalid JSON: nested too deeply"
    if "integer string conversion" in str(exc):
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        return "invalid_json", (
            f"invalid JSON: a number with more than {limit} digits (Python does not convert it)"
        )
    return "invalid_json", f"invalid JSON: {exc}"


class ValueScanner:
    """Find where a JSON value ends without parsing it, text piece by text piece.

    Feed text with :meth:`scan` from the value's first character on; it returns the offset
    just past the value, or ``None`` when the text ended first (call again with the next
    piece, starting at offset 0).  Brackets are counted outside strings only; escapes inside
    strings are skipped, so ``"\\"]"`` does not close anything.
    """

    __slots__ = ("_depth", "_escape", "_scalar", "_started", "_string")

    def __init__(self) -> None:
        self._depth, self._string, self._escape = 0, False, False
        self._started, self._scalar = False, False

    def scan(self, text: str, i: int) -> int | None:
        """Scan ``text`` from ``i``; return the end of the value, or None if it goes on."""
        n = len(text)
        if not self._started and i < n:
            self._started = True
            self._scalar = text[i] not in '"[{'
        if self._scalar:
            m = _SCALAR_END.search(text, i)
            return None if m is None else m.start()
        while i < n:
            if self._escape:
                self._escape, i = False, i + 1
                continue
            if self._string:
                m = _IN_STRING.search(text, i)
                if m is None:
                    return None
                i = m.end()
                if m.group() == "\\":
                    self._escape = True
                    continue
                self._string = False
                if self._depth == 0:
                    return i
                continue
            m = _STRUCTURE.search(text, i)
            if m is None:
                return None
            i, c = m.end(), m.group()
            if c == '"':
                self._string = True
            elif c in "[{":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    return i
        return None


def json_kind(value: Any) -> str:
    """Name a parsed JSON value's kind: ``null``, ``boolean``, ``number``, ``string`` and so on."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def a_json_kind(value: Any) -> str:
    """Name the kind with its article, for messages: ``a list``, ``an object``, ``null``."""
    kind = json_kind(value)
    return "null" if kind == "null" else ("an " if kind[0] in "aeiou" else "a ") + kind


def is_encodable(text: str) -> bool:
    """Tell whether ``text`` can be UTF-8 (JSON can spell lone surrogates; UTF-8 cannot)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
