"""Strict JSON: one value, no duplicate keys at any depth, no NaN/Infinity, no lone surrogates."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any


class StrictJSONError(ValueError):
    """A document that is not exactly one unambiguous JSON value; `pos` is a character offset."""

    def __init__(self, reason: str, pos: int | None = None, doc: str = "") -> None:
        self.reason = reason
        self.pos = pos
        self.lineno: int | None = None
        self.colno: int | None = None
        if pos is not None:
            self.lineno, self.colno = _line_col(doc, pos)
        where = f" at line {self.lineno} column {self.colno}" if self.lineno is not None else ""
        super().__init__(f"{reason}{where}")


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # `1e400` is valid JSON syntax but no double: Python would read it as infinity, which
    # re-serialises as `Infinity` (not JSON) or `null`, a value the sender never wrote.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} overflows a double")
    return value


# CPython's default bound on int(str) (sys.int_info.default_max_str_digits), held here so that a
# process run with PYTHONINTMAXSTRDIGITS=0 does not spend quadratic time converting a huge number.
MAX_DIGITS = 4300


def _integer(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_DIGITS:
        raise ValueError(f"Exceeds the limit ({MAX_DIGITS} digits) for an integer: it has {digits}")
    return int(text)


def _exact(text: str) -> Decimal:
    # The number as written: a double would read 100.00000000000000001 as 100.0.
    if len(text) > MAX_DIGITS:
        raise ValueError(f"Exceeds the limit ({MAX_DIGITS} characters) for a number")
    _finite(text)
    return Decimal(text)


_decoder = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite, parse_int=_integer
)
_exact_decoder = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_exact, parse_int=_integer
)


def loads(doc: str | bytes, *, exact: bool = False) -> Any:
    """Parse one strict JSON value or raise StrictJSONError naming what is wrong and where.

    With `exact`, a number with a fraction or an exponent is a Decimal of exactly what was
    written, not the nearest double (integers are exact either way).
    """
    if isinstance(doc, bytes | bytearray):
        try:
            text = bytes(doc).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJSONError(f"invalid UTF-8 at byte {exc.start}") from None
        if text.startswith("\ufeff"):
            raise StrictJSONError("byte order mark before the JSON value", 0, text)
    else:
        text = doc
    try:
        value = (_exact_decoder if exact else _decoder).decode(text)
    except _Duplicate as exc:
        where = _object_of_duplicate(text)
        raise StrictJSONError(f"duplicate key {exc.key!r} in the object", where, text) from None
    except json.JSONDecodeError as exc:
        reason = "trailing data after the JSON value" if exc.msg == "Extra data" else exc.msg
        raise StrictJSONError(reason, exc.pos, text) from None
    except RecursionError:
        raise StrictJSONError("nesting too deep") from None
    except ValueError as exc:
        # int() refusing a huge number, or a NaN/Infinity constant
        raise StrictJSONError(str(exc)) from None
    # A str may carry a lone surrogate unescaped; bytes decoded above cannot.
    raw = isinstance(doc, str) and not doc.isascii()
    if ("\\u" in text or raw) and _has_lone_surrogate(value):
        raise StrictJSONError("lone surrogate in a string")
    return value


def _object_of_duplicate(text: str) -> int | None:
    """Where the object with a duplicate key starts (its `{`), read again on the slow path.

    The C scanner gives the hook no position; Python's scanner hands `parse_object` the offset,
    so a document already known to be bad is re-read with it, only to say where.
    """

    def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        start = s_and_end[1] - 1

        def pairs(found: list[tuple[str, Any]]) -> dict[str, Any]:
            try:
                return _pairs(found)
            except _Duplicate:
                raise _Located(start) from None

        args = (*args[:3], pairs, *args[4:])
        return json.decoder.JSONObject(s_and_end, *args, **kwargs)  # type: ignore[attr-defined]

    locator = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
    locator.parse_object = parse_object  # type: ignore[attr-defined]
    locator.scan_once = json.scanner.py_make_scanner(locator)  # type: ignore[attr-defined]
    try:
        locator.decode(text)
    except _Located as found:
        return found.pos
    except (ValueError, RecursionError):
        return None
    return None


class _Located(Exception):
    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[str] = [item]
        elif isinstance(item, dict):
            strings = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for s in strings:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _line_col(doc: str, pos: int) -> tuple[int, int]:
    lineno = doc.count("\n", 0, pos) + 1
    colno = pos - doc.rfind("\n", 0, pos)
    return lineno, colno
