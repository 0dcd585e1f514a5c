"""Where a client presents its credential: the header names, in one place."""

from __future__ import annotations

from collections.abc import Callable, Sequence

# The headers a client presents its credential in (lower-case), the first one present read.
CREDENTIAL_HEADERS = ("authorization", "api-key")


def credential_of(values: Callable[[str], Sequence[str]]) -> str | None:
    """The credential a request presents, from `values` (a header's values by lower-case
    name, none when absent)."""
    for name in CREDENTIAL_HEADERS:  # a loop, not a generator: it runs on every request
        given = values(name)
        if given and given[0]:
            return given[0]
    return None
