"""The content codings the tap can read, and asking an upstream for those only."""

from __future__ import annotations

# An upstream is asked for no other coding on a recorded route.
READABLE_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "identity"})


def readable_accept_encoding(accept_encoding: str) -> str:
    """The client's Accept-Encoding without the codings the tap cannot read (`*` included),
    so that every answer it must record comes in one it can; `identity` if none is left."""
    kept = [
        token.strip()
        for token in accept_encoding.split(",")
        if token.split(";")[0].strip().lower() in READABLE_CODINGS
    ]
    return ", ".join(kept) or "identity"
