"""Fuzzing the body reader from raw bytes, as a client could send them: reading a body raises
nothing but `BodyError`, and what the proxy reads is what a plain JSON parser (any upstream's)
reads.

The suite runs a bounded, derandomized number of examples. A longer, random run:

    FUZZ_EXAMPLES=100000 pytest tests/admission/fuzz --timeout=0

(a failure prints a `@reproduce_failure` line that replays it).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given

from proxy.admission import body
from tests.admission.fuzz.bodies import FUZZ, LIMITS, read, wire


def same(proxy_reads: Any, upstream_reads: Any) -> bool:
    """Equal JSON values, a number equal to the double nearest it aside (orjson's reading of
    an integer past 64 bits)."""
    if isinstance(proxy_reads, float) and isinstance(upstream_reads, int):
        return not isinstance(upstream_reads, bool) and proxy_reads == float(upstream_reads)
    if type(proxy_reads) is not type(upstream_reads):
        return False
    if isinstance(proxy_reads, dict):
        return proxy_reads.keys() == upstream_reads.keys() and all(
            same(proxy_reads[k], upstream_reads[k]) for k in proxy_reads
        )
    if isinstance(proxy_reads, list):
        return len(proxy_reads) == len(upstream_reads) and all(
            same(a, b) for a, b in zip(proxy_reads, upstream_reads, strict=True)
        )
    return bool(proxy_reads == upstream_reads)


@FUZZ
@given(sent=wire(hostile=True), limit=LIMITS)
def test_the_body_reader_refuses_only_with_a_body_error(
    sent: tuple[bytes, str], limit: int
) -> None:
    raw, content_encoding = sent
    refused: body.BodyError | None = None
    try:
        decoded, parsed = read(raw, content_encoding, limit)
    except body.BodyError as exc:
        refused = exc
    if refused is not None:
        assert (refused.status, bool(refused.code)) in {(400, True), (413, True), (415, True)}
        return
    if body.codings(content_encoding):
        assert len(decoded) <= limit  # a bomb stops at the limit
    assert isinstance(parsed.get("input", []), str | list)
    # The upstream reads the same document, whatever its parser: no NaN, no duplicate key
    # that a parser keeping the first and one keeping the last would read two ways.
    assert same(parsed, json.loads(decoded))
    assert same(parsed, json.loads(decoded, object_pairs_hook=first_wins))


def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(reversed(pairs))
