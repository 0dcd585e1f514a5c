"""The gate offline: read logged request bodies (JSON or JSON Lines), report each output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.gate import items, strictjson
from proxy.gate.verdict import Finding, Verdict


class DocumentError(ValueError):
    """A file that cannot be read as request bodies; the message names the file and position."""


@dataclass(frozen=True)
class Document:
    """One request body from a file; `line` is set for JSON Lines."""

    body: dict[str, Any]
    line: int | None = None


def iter_documents(name: str, data: bytes) -> Iterator[Document]:
    """One JSON document, or JSON Lines of them; each a request body or a bare array of items."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{name}: invalid UTF-8 at byte {exc.start}") from None
    # JSON Lines ends a line at "\n" only: a raw U+2028 or NEL inside a string is part of the
    # string (str.splitlines would cut there). A "\r" before it is JSON whitespace.
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if not _blank(line)), None)
    if first is None:
        raise DocumentError(f"{name}: no JSON document in the file")
    try:
        yield _document(name, strictjson.loads(text), None)
        return
    except strictjson.StrictJSONError as whole:
        if not _parses(lines[first]):
            raise DocumentError(f"{name}: {whole}") from None
    for number, line in enumerate(lines, start=1):
        if _blank(line):
            continue
        try:
            value = strictjson.loads(line)
        except strictjson.StrictJSONError as exc:
            col = f" column {exc.colno}" if exc.colno is not None else ""
            raise DocumentError(f"{name}: line {number}{col}: {exc.reason}") from None
        yield _document(name, value, number)


def _blank(line: str) -> bool:
    """Whether a line holds only JSON whitespace."""
    return not line.strip(" \t\r")


def _parses(line: str) -> bool:
    try:
        strictjson.loads(line)
    except strictjson.StrictJSONError:
        return False
    return True


def _document(name: str, value: Any, line: int | None) -> Document:
    if isinstance(value, list):
        return Document({"input": value}, line)
    if isinstance(value, dict):
        if "input" in value and not isinstance(value["input"], list | str):
            where = f"{name}: line {line}" if line is not None else name
            raise DocumentError(f"{where}: `input` is neither an array of items nor a string")
        return Document(value, line)
    where = f"{name}: line {line}" if line is not None else name
    raise DocumentError(f"{where}: a document is a request body (object) or an array of items")


def report_json(verdict: Verdict) -> str:
    return json.dumps(
        {"outcome": verdict.outcome, "findings": [f.as_dict() for f in verdict.findings]}
    )


def report_lines(name: str, document: Document, verdict: Verdict) -> Iterator[str]:
    """One line per function_call_output (and per envelope item), then the outcome."""
    prefix = f"{name}:{document.line}" if document.line is not None else name
    input_items = document.body.get("input")
    # An output that is also an envelope has two findings: one line each.
    findings: dict[int, list[Finding]] = {}
    for f in verdict.findings:
        findings.setdefault(f.index, []).append(f)
    if isinstance(input_items, list):
        for index, item in enumerate(input_items):
            found = findings.get(index, [])
            if not items.is_output(item) and not found:
                continue
            call_id = items.output_call_id(item) if items.is_output(item) else None
            if not found:
                name_ = _tool_name(input_items, index, call_id)
                yield f"{prefix}: input[{index}] {call_id} {name_ or '-'}: ok"
                continue
            for finding in found:
                detail = finding.reason
                if finding.fail:
                    detail += " " + ", ".join(f"{v.path or '/'} ({v.reason})" for v in finding.fail)
                yield (
                    f"{prefix}: input[{index}] {finding.call_id or '-'} {finding.name or '-'}: "
                    f"{detail} [{finding.action}]"
                )
    yield f"{prefix}: outcome {verdict.outcome}, {len(verdict.findings)} finding(s)"


def _tool_name(input_items: list[Any], index: int, call_id: str | None) -> str | None:
    for item in reversed(input_items[:index]):
        if call_id is not None and items.pairing_key(item) == call_id:
            name = item.get("name")
            return name if isinstance(name, str) else None
    return None
