"""A schema compiled once is found again by its JSON; the limits still hold for each lookup."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema.exceptions import SchemaError

from proxy.gate.schemas import SchemaCache, SchemaLimitError, SchemaLimits

SMALL = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 5}}}
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}
GENEROUS = SchemaLimits()
STRICT = SchemaLimits(max_subschemas=10)

# (first schema, its limits, then the schema asked for, its limits, what the second gets)
ROWS: list[tuple[str, Any, SchemaLimits, Any, SchemaLimits, str]] = [
    ("same schema, same limits", SMALL, GENEROUS, SMALL, GENEROUS, "compiled"),
    ("keys in another order", SMALL, GENEROUS, dict(reversed(SMALL.items())), GENEROUS, "same"),
    ("compiled under generous limits, asked under strict", WIDE, GENEROUS, WIDE, STRICT, "refused"),
    ("refused under strict, asked under generous", WIDE, STRICT, WIDE, GENEROUS, "compiled"),
    ("invalid schema, remembered", {"type": 5}, GENEROUS, {"type": 5}, GENEROUS, "invalid"),
    (
        "an integer beyond 64 bits",
        {"maximum": 2**70},
        GENEROUS,
        {"maximum": 2**70},
        GENEROUS,
        "same",
    ),
    ("not an object", [1], GENEROUS, [1], GENEROUS, "invalid"),
]


def _outcome(cache: SchemaCache, schema: Any, limits: SchemaLimits) -> Any:
    try:
        return cache.compile(schema, limits)
    except SchemaLimitError:
        return "refused"
    except SchemaError:
        return "invalid"


@pytest.mark.parametrize(
    ("first", "first_limits", "second", "second_limits", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_second_lookup(
    first: Any,
    first_limits: SchemaLimits,
    second: Any,
    second_limits: SchemaLimits,
    expected: str,
) -> None:
    cache = SchemaCache()
    before = _outcome(cache, first, first_limits)
    pending = cache.pending(second, second_limits)
    after = _outcome(cache, second, second_limits)
    if expected == "same":
        assert after is before
        assert not pending
    elif expected == "compiled":
        assert not isinstance(after, str)
        assert after.validator.is_valid({"p1": 1, "q": "abc"})
    else:
        assert after == expected
        assert not pending
