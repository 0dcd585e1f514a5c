"""Which requests the gate inspects: paths normalised the way any upstream might read them."""

from __future__ import annotations

import re
from urllib.parse import unquote

# The canonical gated paths; a gated request is forwarded to exactly the path that was checked.
GATED = {
    "/v1/responses": "responses",
    "/v1/responses/compact": "responses_compact",
    "/responses": "responses",
    "/responses/compact": "responses_compact",
}

_PATH_PARAMS = re.compile(r";[^/]*")
_ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?]*")
_UNRESERVED_ESCAPE = re.compile(r"%(2[dDeE]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]|5[fF]|7[eE])")


def split_target(raw_target: str) -> tuple[str, str]:
    """The raw path and the raw query (with its `?`, or empty).

    An absolute-form target (`http://host/path`, RFC 9112 §3.2.2) is read as its path.
    """
    absolute = _ABSOLUTE_FORM.match(raw_target)
    if absolute is not None:
        raw_target = raw_target[absolute.end() :]
    path, sep, query = raw_target.partition("?")
    return path if path.startswith("/") else "/" + path, sep + query


def normalise(path: str) -> str:
    """RFC 3986 normalisation for routing: unreserved escapes decoded, dot segments and
    duplicate slashes removed, no trailing slash."""
    path = _UNRESERVED_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)
    out: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out)


def gated_path(raw_path: str) -> str | None:
    """The canonical gated path this raw path could reach at an upstream, or None.

    Stricter than `normalise`: every escape is decoded (an upstream may decode `%2F`),
    `\\` read as `/`, case folded (some servers route case-insensitively) and path
    parameters (`;x`) dropped.
    """
    loose = _PATH_PARAMS.sub("", unquote(raw_path, errors="replace").replace("\\", "/"))
    for candidate in (normalise(raw_path), normalise(loose)):
        folded = candidate.lower()
        if folded in GATED:
            return folded
    return None
