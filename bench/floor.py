"""The design's floor: the least a gating proxy must do, and nothing more.

`python bench/floor.py --upstream URL --port P [--uvloop]`. Beside the pass-through
(`passthrough.py`, which never reads a body), a minimal aiohttp proxy that does what the
design cannot do without: it reads the whole body, parses it strictly (jiter, duplicate keys,
NaN and infinities refused), pairs each `function_call_output` with its `function_call`
(verdicts cached by the call's name and arguments), forwards the body it read, and relays the
answer as it comes (the pass-through's session and relay). A body it will not forward is a
400. It keeps no ledger: an output with no call in its input passes when the request names a
`previous_response_id`. What replay-proxy costs above this is its own work, not the price
of parsing (issue 26).
"""

from __future__ import annotations

import sys
from typing import Any

import jiter
from aiohttp import web
from passthrough import relay, serve

# Verdicts by (name, arguments): a call judged once costs a lookup after; bounded.
_VERDICTS: dict[tuple[str, str], bool] = {}
_MAX_VERDICTS = 100_000


def _refused(reason: str) -> web.Response:
    return web.json_response({"error": {"code": reason}}, status=400)


def verdict(name: str, arguments: str) -> bool:
    """Whether a call's arguments are a strict JSON object; cached."""
    key = (name, arguments)
    found = _VERDICTS.get(key)
    if found is None:
        try:
            found = isinstance(_strict(arguments.encode()), dict)
        except ValueError:
            found = False
        if len(_VERDICTS) >= _MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[key] = found
    return found


def _strict(data: bytes) -> Any:
    return jiter.from_json(data, allow_inf_nan=False, catch_duplicate_keys=True, cache_mode="keys")


def judge(body: Any) -> str | None:
    """Why the body is refused, or None: every call's verdict, every output paired."""
    if not isinstance(body, dict):
        return "not_an_object"
    items = body.get("input")
    if not isinstance(items, list):
        return None
    calls: set[Any] = set()
    chained = body.get("previous_response_id") is not None
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments")
            if not isinstance(name, str) or not isinstance(arguments, str):
                return "invalid_call"
            if not verdict(name, arguments):
                return "arguments_parse"
            calls.add(item.get("call_id"))
        elif kind == "function_call_output" and item.get("call_id") not in calls and not chained:
            return "orphan"
    return None


async def gate(request: web.Request) -> web.StreamResponse:
    if not request.body_exists:
        return await relay(request, None)
    raw = await request.read()
    try:
        body = _strict(raw)
    except ValueError:
        return _refused("invalid_json")
    reason = judge(body)
    if reason is not None:
        return _refused(reason)
    return await relay(request, raw)


if __name__ == "__main__":
    sys.exit(serve(__doc__, gate))
