"""Request bodies of the gated routes: content type, content coding, size limit, strict JSON."""

from __future__ import annotations

import json
import zlib
from typing import Any

import brotli
import jiter
import orjson

from proxy.gate import strictjson
from proxy.gate.errors import ProxyError

_CHUNK = 64 * 1024
_INFINITY = float("inf")


class BodyError(ProxyError):
    """A body the proxy will not forward: the HTTP status and the error `code` that says why."""


def check_content_type(content_type: str) -> None:
    """Only `application/json` (any parameters, e.g. a charset) is read; else 415."""
    if content_type == "application/json":
        return  # what nearly every client sends
    mime, _, params = content_type.partition(";")
    if mime.strip().lower() != "application/json":
        shown = content_type or "none"
        raise BodyError(
            415, "unsupported_media_type", f"content-type must be application/json, not {shown}"
        )
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise BodyError(
                415, "unsupported_charset", f"charset must be utf-8, not {value.strip()}"
            )


def codings(content_encoding: str) -> list[str]:
    """The content codings in the order they were applied, `identity` left out."""
    if not content_encoding:
        return []  # most bodies and answers: none
    found = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    return [c for c in found if c != "identity"]


def decode(raw: bytes, applied: list[str], limit: int) -> bytes:
    """Undo the content codings; a decoded size over `limit` is 413 (a bomb stops at the limit)."""
    data = raw
    for coding in reversed(applied):
        try:
            data = _decode_whole(data, coding, limit)
        except BodyError as exc:
            if coding != "deflate" or exc.status != 400:
                raise
            # `deflate` means zlib-wrapped; some clients send a raw deflate stream, which is
            # unambiguous.
            data = _decode_whole(data, coding, limit, raw_deflate=True)
    return data


def _decode_whole(data: bytes, coding: str, limit: int, *, raw_deflate: bool = False) -> bytes:
    inflater = Inflater(coding, limit, raw_deflate=raw_deflate)
    out = inflater.feed(data)
    inflater.end()
    return out


class Inflater:
    """Undoes one content coding (gzip, deflate, br) as the bytes arrive, never past `limit`
    decoded bytes. Every fault is a BodyError: 415 for a coding it cannot undo, 413 past the
    limit, 400 for a corrupt, truncated or overlong stream."""

    def __init__(self, coding: str, limit: int, *, raw_deflate: bool = False) -> None:
        self.coding = coding
        self.limit = limit
        self.size = 0
        self._zlib: Any = None
        self._brotli: Any = None
        if coding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif coding == "deflate":
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS if raw_deflate else zlib.MAX_WBITS)
        elif coding == "br":
            self._brotli = brotli.Decompressor()
        else:
            raise BodyError(
                415, "unsupported_content_encoding", f"content-encoding {coding} is not supported"
            )

    def feed(self, data: bytes) -> bytes:
        """The decoded bytes of the next part of the stream."""
        out = bytearray()
        try:
            if self._brotli is not None:
                self._unbrotli(data, out)
            else:
                self._inflate(data, out)
        except zlib.error as exc:
            raise self._fault(f"the {self.coding} body is corrupt: {exc}") from None
        except brotli.error as exc:
            raise self._fault(f"the {self.coding} body is corrupt: {exc}") from None
        self.size += len(out)
        return bytes(out)

    def end(self) -> None:
        """The stream is over: 400 unless the coding's own end has been read."""
        done = self._zlib.eof if self._zlib is not None else self._brotli.is_finished()
        if not done:
            raise self._fault(f"the {self.coding} body is truncated")

    def _inflate(self, data: bytes, out: bytearray) -> None:
        inflater = self._zlib
        pending = data
        while pending and not inflater.eof:
            out += inflater.decompress(pending, self.limit + 1 - self.size - len(out))
            self._check(out)
            pending = inflater.unconsumed_tail
        if inflater.eof and (inflater.unused_data or pending):
            raise self._fault(f"data after the end of the {self.coding} body")

    def _unbrotli(self, data: bytes, out: bytearray) -> None:
        decompressor = self._brotli
        for start in range(0, len(data), _CHUNK):
            out += decompressor.process(data[start : start + _CHUNK], output_buffer_limit=_CHUNK)
            while not decompressor.can_accept_more_data():
                out += decompressor.process(b"", output_buffer_limit=_CHUNK)
                self._check(out)
            self._check(out)

    def _check(self, out: bytearray) -> None:
        if self.size + len(out) > self.limit:
            raise BodyError(
                413, "body_too_large", f"the decoded body exceeds the limit of {self.limit} bytes"
            )

    def _fault(self, message: str) -> BodyError:
        return BodyError(400, "invalid_content_encoding", message)


def loads(decoded: bytes) -> Any:
    """Strict JSON (see `strictjson`), at native speed when the body allows it.

    jiter, told to refuse duplicate keys and NaN/Infinity, refuses everything strict JSON
    refuses (and deep nesting, past 200 levels) except a number that overflows a double, which
    it reads as infinity: a walk over the value looks for one. Whatever it refuses is read
    again exactly, for the precise reason or for a value only jiter refuses.
    """
    value = loads_shallow(decoded)
    # (None too for a body that is `null`: read again, it is read as what it is.)
    return exact(decoded) if value is None else value


def loads_shallow(decoded: bytes) -> Any:
    """Strict JSON as `loads` reads it, or None where `loads` would need its exact second read
    (a refusal, nesting past jiter's 200 levels, a number past a double): what a part of a
    body may be read as alone, since read alone it is nested less deeply than in its body,
    and only a read of the whole body says what that body is."""
    try:
        value = jiter.from_json(
            decoded, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys"
        )
    except ValueError:
        return None
    return None if _has_infinity(decoded, value) else value


# Up to this size a body is told free of infinities by writing it again (a few times quicker
# than a walk over its values there); past it, where long escaped strings make writing dearer
# than the walk, by the walk.
_WRITTEN_BYTES = 8192


def _has_infinity(decoded: bytes, value: Any) -> bool:
    """Whether jiter read a number of `decoded` (its `value`) as an infinity.

    orjson writes an infinity as `null`, where the bytes read hold a number: bytes written
    alike (compact JSON, as most clients send it) hold none. Else, orjson writes again every
    `null` of the bytes read: a literal one, or one in a string (its letters are never
    escaped; a newline escaped before `ull` is escaped again alike). So the written value holds
    at least as many `null`s as the bytes, one more for each infinity, and as many only if
    there is none. More is a string escaped differently, or an infinity: the walk decides.
    """
    if len(decoded) <= _WRITTEN_BYTES:
        try:
            written = orjson.dumps(value)
        except orjson.JSONEncodeError:  # an integer beyond 64 bits
            return _walk(value)
        if written == decoded or written.count(b"null") == decoded.count(b"null"):
            return False
    return _walk(value)


def _walk(value: Any) -> bool:
    stack: list[Any] = [[value]]
    while stack:
        item = stack.pop()
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is str:  # most of a body's values: asked first
                continue
            if kind is dict or kind is list:
                stack.append(child)
            elif kind is float and (child == _INFINITY or child == -_INFINITY):
                return True
    return False


def exact(decoded: bytes) -> Any:
    """Strict JSON with every number exactly as written; a StrictJSONError names the problem."""
    try:
        return strictjson.loads(decoded)
    except strictjson.StrictJSONError as exc:
        raise BodyError(400, "invalid_json", f"the body is not unambiguous JSON: {exc}") from None


def parse(decoded: bytes) -> dict[str, Any]:
    """The request body as an object whose `input`, if present, is a string or an array."""
    body = loads(decoded)
    if not isinstance(body, dict):
        raise BodyError(400, "invalid_body", "the body must be a JSON object")
    if "input" in body and not isinstance(body["input"], str | list):
        raise BodyError(400, "invalid_input", "`input` must be a string or an array of items")
    return body


def with_input(parsed: dict[str, Any], changed: list[Any]) -> bytes:
    """The body with `changed` as its `input`: the gate's, stripped pairs gone and rewritten
    outputs replaced, every other item the client's own. The reader keeps every integer exact,
    at any size, so the body needs no second read: its numbers go on with the values the client
    wrote."""
    return dumps({**parsed, "input": changed})


def dumps(value: Any) -> bytes:
    """Compact JSON of a parsed body, integers beyond 64 bits (valid JSON, read exactly) too."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
