"""Whether a replayed call's `arguments` are the ones an upstream emitted."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from proxy.gate import strictjson


def same_arguments(emitted: Any, replayed: Any) -> bool:
    """Whether a replayed call's `arguments` are the ones emitted: the same string, or strict
    JSON texts of the same value, numbers written alike.

    A client that parsed the arguments and replays `JSON.stringify` of them (the AI SDK) changes
    spacing, key order and escapes, not the call. A number written otherwise (`1.0` for `1`)
    is not the same: readers that keep every digit may read the two apart.
    """
    if emitted == replayed:
        return True
    if not isinstance(emitted, str) or not isinstance(replayed, str):
        return False
    try:
        # Exact: an integer is an int, any other number the Decimal of its digits as written.
        first = strictjson.loads(emitted, exact=True)
        second = strictjson.loads(replayed, exact=True)
    except strictjson.StrictJSONError:
        return False
    return _alike(first, second)


def _alike(first: Any, second: Any) -> bool:
    """Whether two strict JSON values are the same, kind for kind (`1` is not `true`, nor `1.0`):
    a loop, not a recursion, as the values may nest as deep as the reader allows."""
    pending = [(first, second)]
    while pending:
        a, b = pending.pop()
        if type(a) is not type(b):
            return False
        if type(a) is dict:
            if a.keys() != b.keys():
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif type(a) is list:
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif type(a) is Decimal:
            # Its digits and exponent as written: `1.0` and `1.00` are two spellings apart.
            if a.as_tuple() != b.as_tuple():
                return False
        elif a != b:
            return False
    return True
