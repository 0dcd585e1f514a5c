"""How a recorded response is written as a store's value and read back: JSON for the recording,
and, in Redis, its previous id length-prefixed before it."""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.state.recording import RecordedResponse

_LENGTH = re.compile(rb"(0|[1-9][0-9]{0,9}):")


def encode(recording: RecordedResponse) -> str:
    """The recording as JSON; its response id is the store's key, not part of the value."""
    value: dict[str, Any] = {"prev": recording.previous_response_id, "items": recording.items}
    if recording.inputs:
        value["inputs"] = recording.inputs
    if recording.tools is not None:
        value["tools"] = recording.tools
    if recording.upstream is not None:
        value["upstream"] = recording.upstream
    if recording.whole is not None:
        value["whole"] = recording.whole
    return json.dumps(value)


def decode(response_id: str, data: str | bytes) -> RecordedResponse:
    """The recording `encode` wrote; ValueError for anything else (a value corrupted, or
    written by another program), so that no stored value reaches the gate unchecked."""
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    previous, found, inputs = value.get("prev"), value.get("items"), value.get("inputs", 0)
    tools, upstream, whole = value.get("tools"), value.get("upstream"), value.get("whole")
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise ValueError("items: not a list of objects")
    if type(inputs) is not int or not 0 <= inputs <= len(found):
        raise ValueError("inputs: not a count of its items")
    for key, given in (("prev", previous), ("tools", tools), ("upstream", upstream)):
        if given is not None and not isinstance(given, str):
            raise ValueError(f"{key}: not a string")
    if whole is not None and not isinstance(whole, list):
        raise ValueError("whole: not a list")
    return RecordedResponse(
        response_id,
        previous,
        tuple(found),
        inputs,
        tools,
        upstream,
        None if whole is None else tuple(whole),
    )


def as_stored(text: str) -> bytes:
    """`text` as Redis holds it: any string a JSON body can carry (a lone surrogate too)."""
    return text.encode("utf-8", "surrogatepass")


def encode_response(recording: RecordedResponse) -> bytes:
    """A response's value in Redis: its previous id length-prefixed, then its recording."""
    previous = as_stored(recording.previous_response_id or "")
    return b"%d:%s%s" % (len(previous), previous, encode(recording).encode())


def decode_response(response_id: str, value: bytes) -> RecordedResponse:
    """The recording `encode_response` stored; ValueError for any other value."""
    prefix = _LENGTH.match(value)
    if prefix is None:
        raise ValueError("no length prefix")
    start = prefix.end()
    end = start + int(prefix[1])
    if end > len(value):
        raise ValueError("shorter than its prefix says")
    recording = decode(response_id, value[end:])
    if as_stored(recording.previous_response_id or "") != value[start:end]:
        raise ValueError("its prefix names another previous response")
    return recording
