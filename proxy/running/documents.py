"""What `check` reads: files of JSON or JSON Lines, each value found as the kind of document it
is (a request body, a wrapped one, a response, an input_items list, an audit record, a Chat
Completions body, an MCP JSON-RPC message), and each line that cannot be read named by file and
line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from proxy.gate import items, strictjson

Kind = Literal[
    "request",
    "items",
    "response",
    "input_items",
    "audit_record",
    "chat_completions",
    "mcp_message",
]

# The keys a log line wraps a request (or response) under, looked for in this order; nested up
# to _MAX_WRAPPING deep (`{"request": {"body": {...}}}`), as an object or a JSON string.
WRAPPERS = ("request", "body", "params")
_MAX_WRAPPING = 3
JSON_LINES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class Document:
    """One value to check, where it was, and what it was found to be.

    `value` is a request body for `request`, `items` (`{"input": [...]}`), `input_items` and
    `chat_completions`; the response for `response`; the record for `audit_record`. `via` is the
    key path a log line wrapped it under (`request.body`); `tools` are the tools of the request
    a response answered, when the line holds both; `reversed` says an input_items list was read
    newest first, as the API lists it by default."""

    file: str
    line: int | None
    element: int | None
    kind: Kind
    value: dict[str, Any]
    via: str | None = None
    tools: Any = None
    reversed: bool = False

    # Set for an element of an array that is itself one line of JSON Lines.
    in_lines: bool = False

    @property
    def where(self) -> str:
        """`file`, `file:line`, `file[element]` (an element of a whole file's array, whose
        line is kept apart) or `file:line[element]`."""
        place = self.file
        if self.line is not None and (self.element is None or self.in_lines):
            place += f":{self.line}"
        if self.element is not None:
            place += f"[{self.element}]"
        return place


@dataclass(frozen=True)
class UnreadableDocument:
    """A file, line or element that could not be read as a document, and why."""

    file: str
    line: int | None
    reason: str
    element: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        place = self.file if self.line is None else f"{self.file}: line {self.line}"
        if self.column is not None:
            place += f" column {self.column}"
        if self.element is not None:
            place += f", element {self.element}"
        return f"{place}: {self.reason}"


def iter_documents(name: str, data: bytes) -> Iterator[Document | UnreadableDocument]:
    """The documents of one file: one JSON value, or JSON Lines of them. A line that cannot be
    read is yielded as UnreadableDocument and the next one read."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield UnreadableDocument(name, None, f"invalid UTF-8 at byte {exc.start}")
        return
    # JSON Lines ends a line at "\n" only: a raw U+2028 or NEL inside a string is part of the
    # string (str.splitlines would cut there). A "\r" before it is JSON whitespace.
    lines = text.split("\n")
    filled = [i for i, line in enumerate(lines) if not _blank(line)]
    if not filled:
        yield UnreadableDocument(name, None, "no JSON document in the file")
        return
    # A .jsonl file is JSON Lines even when it has one line: its findings name that line.
    if not name.endswith(JSON_LINES):
        try:
            whole = strictjson.loads(text)
        except strictjson.StrictJSONError as exc:
            # JSON Lines when its first line is a value of its own, or (that one broken) its
            # second.
            if not any(_parses(lines[i]) for i in filled[:2]) or len(filled) < 2:
                yield UnreadableDocument(name, None, str(exc))
                return
        else:
            yield from _read(name, None, whole, text)
            return
    for number, line in enumerate(lines, start=1):
        if _blank(line):
            continue
        try:
            value = strictjson.loads(line)
        except strictjson.StrictJSONError as exc:
            yield UnreadableDocument(name, number, exc.reason, column=exc.colno)
            continue
        yield from _read(name, number, value, None)


def _blank(line: str) -> bool:
    """Whether a line holds only JSON whitespace."""
    return not line.strip(" \t\r")


def _parses(line: str) -> bool:
    try:
        strictjson.loads(line)
    except strictjson.StrictJSONError:
        return False
    return True


def _read(
    name: str, line: int | None, value: Any, text: str | None
) -> Iterator[Document | UnreadableDocument]:
    """The documents of one JSON value: itself, or each element of an array of documents."""
    if isinstance(value, list) and value and all(_is_document(v) for v in value):
        # An array of documents, not of items. A whole file's array names each element's line.
        starts = _element_lines(text) if text is not None else [line] * len(value)
        for element, (start, v) in enumerate(zip(starts, value, strict=True)):
            for found in _found(name, start, v):
                if isinstance(found, UnreadableDocument):
                    yield UnreadableDocument(name, start, found.reason, element)
                else:
                    yield _at(found, element, in_lines=text is None)
        return
    yield from _found(name, line, value)


def _at(document: Document, element: int, *, in_lines: bool) -> Document:
    return Document(
        document.file,
        document.line,
        element,
        document.kind,
        document.value,
        document.via,
        document.tools,
        document.reversed,
        in_lines,
    )


def _found(name: str, line: int | None, value: Any) -> Iterator[Document | UnreadableDocument]:
    if isinstance(value, list):
        yield Document(name, line, None, "items", {"input": value})
        return
    if not isinstance(value, dict):
        yield UnreadableDocument(name, line, _NOT_A_DOCUMENT)
        return
    found = list(_classify(value, None, 0))
    if not found:
        yield UnreadableDocument(name, line, _NOT_A_DOCUMENT)
    for kind, body, via, tools, reversed_ in found:
        if kind == "request" and "input" in body and not isinstance(body["input"], list | str):
            yield UnreadableDocument(
                name, line, "`input` is neither an array of items nor a string"
            )
            continue
        yield Document(name, line, None, kind, body, via, tools, reversed_)


_NOT_A_DOCUMENT = (
    "not a request body, response, input_items list, audit record, Chat Completions body, MCP "
    "JSON-RPC message or array of items (a log line is read when it wraps one under "
    + ", ".join(WRAPPERS)
    + ")"
)

_Found = tuple[Kind, dict[str, Any], str | None, Any, bool]
# What makes a `"jsonrpc": "2.0"` object a message: a method (a request or a notification), a
# result or an error (a response).
_JSON_RPC_MEMBERS = frozenset({"method", "result", "error"})


def _classify(value: dict[str, Any], via: str | None, depth: int) -> Iterator[_Found]:
    if _is_response(value):
        yield "response", value, via, None, False
        return
    if value.get("object") == "list" and isinstance(value.get("data"), list):
        data = value["data"]
        if data and all(isinstance(v, dict) and _is_response(v) for v in data):
            for response in data:
                yield "response", response, via, None, False
            return
        ordered, newest_first = _in_order(data)
        yield "input_items", {"input": ordered}, via, None, newest_first
        return
    if isinstance(value.get("event"), str) and isinstance(value.get("findings"), list):
        yield "audit_record", value, via, None, False
        return
    if value.get("jsonrpc") == "2.0" and not _JSON_RPC_MEMBERS.isdisjoint(value):
        # An MCP message (a request, a notification, a result or an error): a tools/list
        # result gives the tools, a tools/call is judged, the others pass.
        yield "mcp_message", value, via, None, False
        return
    if "input" in value:
        yield "request", value, via, None, False
        if isinstance(value.get("output"), list):
            # A log record of a whole exchange: the input sent and the output it got.
            answer = {"output": value["output"]}
            yield "response", answer, via, value.get("tools"), False
        return
    if isinstance(value.get("messages"), list):
        yield "chat_completions", value, via, None, False
        return
    if depth >= _MAX_WRAPPING:
        return
    request: _Found | None = None
    for key in WRAPPERS:
        inner = _object(value.get(key))
        if inner is None:
            continue
        inner_found = list(_classify(inner, f"{via}.{key}" if via else key, depth + 1))
        if inner_found:
            yield from inner_found
            request = next((f for f in inner_found if f[0] == "request"), None)
            break
    if request is None and "model" in value and not set(value) & {"type", "role", "call_id"}:
        # A request body with nothing to gate (no input: a plain follow-up with instructions).
        yield "request", value, via, None, False
        return
    # A log line that holds the answer beside the request: its calls are checked against the
    # tools of that request.
    response = _object(value.get("response"))
    if response is not None and _is_response(response):
        tools = request[1].get("tools") if request is not None else None
        yield "response", response, f"{via}.response" if via else "response", tools, False


def _object(value: Any) -> dict[str, Any] | None:
    """An object, or a JSON string of one (logs often keep a body as a string)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = strictjson.loads(value)
        except strictjson.StrictJSONError:
            return None
    return value if isinstance(value, dict) else None


def _is_response(value: dict[str, Any]) -> bool:
    if value.get("object") == "response":
        return True
    # Without its `object`: an `output` array and none of the keys of an item or a request.
    return isinstance(value.get("output"), list) and not set(value) & {
        "type",
        "role",
        "call_id",
        "input",
    }


def _is_document(value: Any) -> bool:
    """An element of an array that is a document of its own, not an item of `input`."""
    if not isinstance(value, dict) or set(value) & {"type", "role", "call_id", "output"}:
        return isinstance(value, dict) and _is_response(value)
    return bool(list(_classify(value, None, 0)))


def _in_order(data: list[Any]) -> tuple[list[Any], bool]:
    """An input_items list oldest first: the API lists newest first unless asked otherwise, so
    a list whose outputs come before their calls (and never after) is read reversed."""
    calls_seen: set[str] = set()
    before = after = 0
    outputs: dict[str, int] = {}
    for index, item in enumerate(data):
        key = items.pairing_key(item)
        if key is not None:
            calls_seen.add(key)
            if key in outputs:
                after += 1
        if items.is_output(item):
            call_id = items.output_call_id(item)
            if call_id is not None:
                if call_id in calls_seen:
                    before += 1
                outputs.setdefault(call_id, index)
    if after and not before:
        return list(reversed(data)), True
    return data, False


def _element_lines(text: str) -> list[int | None]:
    """The line each element of the array that is the whole text starts on."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    lines: list[int | None] = []
    size = len(text)
    while True:
        while pos < size and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= size or text[pos] == "]":
            return lines
        lines.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
