"""Which request targets the proxy accepts, which it gates, and the path each goes upstream under.

A target is refused unless it is valid origin-form or absolute-form (RFC 9112 §3.2). A valid one
is normalised, and that normal form is what goes upstream: the proxy classifies exactly the string
it forwards. It is gated when any reading an upstream might give that string names a gated path,
and then it goes upstream as that canonical gated path, which every server reads the same way.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterator
from urllib.parse import unquote

from proxy.admission import dialect
from proxy.gate.values import value

# The canonical gated paths (every dialect's), each with its metrics' route; a gated request is
# forwarded to exactly the path that was checked.
GATED = dialect.GATED
# `GET` of one of these reads a stored response again (`/v1/responses/{response_id}`).
_RESPONSE_READ = re.compile(r"(?:/v1)?/responses/(?!compact$)[^/]+")
# The first segment of the proxy's own namespace (`/-/healthy`): nothing under it is forwarded.
OWN = "-"

_PATH_PARAMS = re.compile(r";[^/]*")
_ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?]*")
_UNRESERVED_ESCAPE = re.compile(r"%(2[dDeE]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]|5[fF]|7[eE])")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
# A normalised path that every reading reads alike: no escapes, no `;`, no `\`.
_PLAIN = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@/]*")
# A target with nothing in it to read two ways: plain segments, and a query without escapes.
_SIMPLE = re.compile(r"((?:/[A-Za-z0-9_~-]+)+)(\?[A-Za-z0-9_.~!$&'()*+,;=:@/?-]*)?")
# RFC 3986 §3.3: a path segment is pchar = unreserved / pct-encoded / sub-delims / ":" / "@".
_NOT_IN_PATH = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]")
# RFC 3986 §3.2: reg-name or IP-literal, then an optional port; no userinfo (RFC 9110 §4.2.4).
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=%]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?")
_SCHEMES = ("http", "https")
# Deeper than this, an escape that still decodes to another one is refused rather than read on.
_DECODINGS = 2


class TargetError(ValueError):
    """A request target that is not valid origin-form or absolute-form; the message says why."""


@value
class Target:
    """A valid request target, read the way the proxy routes and forwards it."""

    path: str  # normalised: what goes upstream unless the target is gated
    query: str  # with its `?`, or empty; forwarded as it came
    gated: str | None  # the canonical gated path a reading of `path` names (None when `own`)
    own: bool  # some reading of `path` is under `/-/`: answered by the proxy, never forwarded

    @property
    def forward(self) -> str:
        """The target that goes upstream: the canonical gated path, or the normalised one."""
        return (self.gated or self.path) + self.query


def iter_problems(raw_target: str) -> Iterator[str]:
    """Why `raw_target` is not a valid origin-form or absolute-form target (RFC 9112 §3.2), as
    readable sentences; nothing when it is one."""
    unprintable = _UNPRINTABLE.search(raw_target)
    if unprintable is not None:
        offset, code = unprintable.start(), ord(unprintable.group())
        if code == 0x20:
            yield f"the request target has a raw space at offset {offset}"
        elif code > 0x7F:
            yield f"the request target has a non-ASCII character at offset {offset}"
        else:
            yield f"the request target has a control character (0x{code:02x}) at offset {offset}"
        return
    fragment = raw_target.find("#")
    if fragment != -1:
        yield f"the request target has a fragment (`#` at offset {fragment}), never sent by clients"
        return
    bad_escape = _BAD_ESCAPE.search(raw_target)
    if bad_escape is not None:
        yield f"the request target has a malformed percent-escape at offset {bad_escape.start()}"
        return
    absolute = _ABSOLUTE_FORM.match(raw_target)
    if absolute is not None:
        scheme, _, authority = absolute.group().partition("://")
        if scheme.lower() not in _SCHEMES:
            yield f"the request target's scheme is {scheme!r}, not http or https"
        elif "@" in authority:
            yield "the request target carries credentials (`user@`), which are not accepted"
        elif _AUTHORITY.fullmatch(authority) is None:
            yield "the request target's authority is not a host and an optional port"
        rest = raw_target[absolute.end() :]
    elif raw_target.startswith("/"):
        rest = raw_target
    else:
        yield "the request target is neither origin-form (`/path`) nor absolute-form (`http://…`)"
        return
    path, _, _ = rest.partition("?")
    bad = _NOT_IN_PATH.search(path)
    if bad is not None:
        yield f"the request target's path has {bad.group()!r}, which a path cannot carry unescaped"


def read_target(raw_target: str) -> Target:
    """The target as the proxy routes and forwards it; TargetError if it is not valid, or if
    its readings name two different gated paths."""
    simple = _SIMPLE.fullmatch(raw_target)
    if simple is not None:
        # Most targets: valid, already normal, and read one way only (no escapes, dots, `;`,
        # empty segments or trailing slash), so the readings below would all agree.
        path, query = simple.group(1), simple.group(2) or ""
        folded = path.lower()
        own = folded == "/" + OWN or folded.startswith(f"/{OWN}/")
        return Target(path, query, folded if not own and folded in GATED else None, own)
    for problem in iter_problems(raw_target):
        raise TargetError(problem)
    raw_path, query = split_target(raw_target)
    path = normalise(raw_path)
    readings = set(iter_readings(path))
    own = any(reading == "/" + OWN or reading.startswith(f"/{OWN}/") for reading in readings)
    if own:
        return Target(path, query, None, own)
    gated = sorted(readings & GATED.keys())
    if len(gated) > 1:
        raise TargetError(f"the request target's path reads as {' and as '.join(gated)}")
    return Target(path, query, gated[0] if gated else None, own)


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
    """The path as it goes upstream: RFC 3986 §6.2.2 normalisation (unreserved escapes decoded,
    the others in upper case, dot segments removed) and duplicate slashes merged; a trailing
    slash is kept."""
    path = _UNRESERVED_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)
    path = _ESCAPE.sub(lambda m: m.group().upper(), path)
    segments = path.split("/")
    out = _resolve(segments, keep_empty=False)
    trailing = segments[-1] in ("", ".", "..") and bool(out)
    return "/" + "/".join(out) + ("/" if trailing else "")


def iter_readings(path: str) -> Iterator[str]:
    """Every path an upstream might route `path` (as `normalise` returns it) to, case folded,
    without a trailing slash.

    A reading takes one choice of each: escapes decoded none, once or twice (`%2F` included);
    Unicode compatibility forms kept or folded (NFKC); a decoded `?`, `#` or NUL read as the
    end of the path or not; `\\` read as `/` or not; `;params` dropped or not; empty segments
    dropped before dot segments are removed, or kept (RFC 3986 §5.2.4). A choice that cannot
    change the path is not tried.
    """
    if _PLAIN.fullmatch(path):
        yield path.lower().rstrip("/") or "/"
        return
    for text in _decodings(path):
        for variant in _unicode_forms(text):
            for cut in _cuts(variant):
                yield from _structural_readings(cut)


def gated_path(raw_path: str) -> str | None:
    """The canonical gated path some reading of this raw path names, or None."""
    readings = set(iter_readings(normalise(raw_path)))
    return next((path for path in GATED if path in readings), None)


def _decodings(path: str) -> Iterator[str]:
    yield path
    text = path
    for _ in range(_DECODINGS):
        decoded = unquote(text, errors="replace")
        if decoded == text:
            return
        yield decoded
        text = decoded
    if _ESCAPE.search(text):
        # An upstream behind more decoders than these could read it as anything.
        raise TargetError("the request target's percent-escapes are nested too deep")


def _unicode_forms(text: str) -> Iterator[str]:
    yield text
    if not text.isascii():
        folded = unicodedata.normalize("NFKC", text)
        if folded != text:
            yield folded


def _cuts(text: str) -> Iterator[str]:
    yield text
    end = min((i for i in (text.find(c) for c in "?#\0") if i != -1), default=-1)
    if end != -1:
        yield text[:end]


def _structural_readings(text: str) -> Iterator[str]:
    slashes = (False, True) if "\\" in text else (False,)
    params = (False, True) if ";" in text else (False,)
    for backslash, drop_params in itertools.product(slashes, params):
        variant = text.replace("\\", "/") if backslash else text
        if drop_params:
            variant = _PATH_PARAMS.sub("", variant)
        segments = variant.casefold().split("/")
        empties = (False, True) if "" in segments[1:-1] else (False,)
        for keep_empty in empties:
            yield "/" + "/".join(s for s in _resolve(segments, keep_empty=keep_empty) if s)


def _resolve(segments: list[str], *, keep_empty: bool) -> list[str]:
    """The segments with dot segments applied (RFC 3986 §5.2.4); empty ones dropped first
    unless `keep_empty`."""
    out: list[str] = []
    for segment in segments[1:] if segments and segments[0] == "" else segments:
        if segment == ".":
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        if segment or keep_empty:
            out.append(segment)
    return out


def reads_response(path: str) -> bool:
    """Whether a `GET` of this normalised path reads one stored response (whose answer the
    ledger records like the answer that created it)."""
    return _RESPONSE_READ.fullmatch(path) is not None
