"""Benchmark workload: realistic Open Responses request bodies (and the same histories as Chat
Completions bodies) and the gate config they meet."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

MODEL = "bench-model"
PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-tenant"}

SALES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["region"],
    "properties": {
        "region": {"type": "string", "enum": ["apac", "emea", "amer"]},
        "week": {"type": "string", "pattern": "^[0-9]{4}-W[0-9]{2}$"},
        "include_lines": {"type": "boolean"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10000},
    },
}
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["order_id"],
    "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "fields": {
            "type": "array",
            "items": {"enum": ["status", "lines", "customer", "shipping", "refunds"]},
            "uniqueItems": True,
        },
    },
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "get_latest_sales_report",
        "description": "The latest weekly sales report for a region.",
        "parameters": SALES_SCHEMA,
    },
    {
        "type": "function",
        "name": "lookup_order",
        "description": "One order by its id, with the fields asked for.",
        "parameters": ORDER_SCHEMA,
    },
]

# The proxy's config in the load benchmark and the gate's Policy in the in-process one:
# get_latest_sales_report is pinned (compiled at start, as config.example.yaml does),
# lookup_order's schema comes from the request's `tools`. A schema failure blocks;
# an `arguments_parse` failure strips, so one proxy serves both failing variants.
GATE_CONFIG: dict[str, Any] = {
    "gate": {"action": "block", "actions": {"arguments_parse": "strip"}},
    "tools": {"get_latest_sales_report": SALES_SCHEMA},
}

_REGIONS = ("apac", "emea", "amer")
_CITIES = ("Zürich", "São Paulo", "Kraków", "東京", "Montréal", "Singapore", "Lyon", "Austin")
_PRODUCTS = ("widget", "gadget", "sprocket", "flange", "gizmo", "doohickey", "bracket")


def _call_id(rng: random.Random) -> str:
    return "call_" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=24))


def _sales_pair(rng: random.Random, n: int, *, long: bool) -> tuple[dict[str, Any], str]:
    arguments = {
        "region": _REGIONS[n % 3],
        "week": f"{2024 + n // 52 % 3}-W{n % 52 + 1:02d}",
        "include_lines": long,
        "limit": 10 + n % 9990,  # within the schema's maximum, however far `n` runs
    }
    rows = [
        {
            "sku": f"SKU-{rng.randrange(10**5):05d}",
            "product": rng.choice(_PRODUCTS),
            "city": rng.choice(_CITIES),
            "units": rng.randrange(1, 500),
            "revenue": round(rng.uniform(10, 50000), 2),
        }
        for _ in range(60 if long else 12)
    ]
    report = {"region": arguments["region"], "week": arguments["week"], "rows": rows}
    # A tool that returns its result through json.dumps' defaults: non-ASCII as \u escapes.
    return arguments, json.dumps(report)


def _order_pair(rng: random.Random, n: int, *, long: bool) -> tuple[dict[str, Any], str]:
    order_id = f"ORD-{100000 + n % 900000:06d}"  # six digits, as the schema's pattern wants
    arguments = {"order_id": order_id, "fields": ["status", "lines", "customer"]}
    lines = "\n".join(
        f"- {rng.randrange(1, 9)} \u00d7 {rng.choice(_PRODUCTS)} @ {rng.uniform(1, 900):.2f} EUR"
        for _ in range(80 if long else 16)
    )
    text = (
        f"Order {arguments['order_id']} for {rng.choice(_CITIES)}: shipped, "
        f"carrier tracking {rng.randrange(10**11):011d}.\nLines:\n{lines}\n"
        "Customer notes: leave at the front desk; call before delivery."
    )
    return arguments, text


def iter_pairs(
    count: int, seed: int = 5, first: int = 0
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`count` (function_call, function_call_output) pairs, every `arguments` distinct; the
    pairs numbered from an even `first` on have arguments no other numbers have."""
    rng = random.Random(seed)
    pairs = []
    for n in range(first, first + count):
        long = n % 10 in (1, 4, 8)  # three outputs in ten are long: a full report, a long order
        if n % 2 == 0:
            name, (arguments, output) = "get_latest_sales_report", _sales_pair(rng, n, long=long)
        else:
            name, (arguments, output) = "lookup_order", _order_pair(rng, n, long=long)
        call_id = _call_id(rng)
        call = {
            "type": "function_call",
            "id": "fc_" + call_id[5:],
            "call_id": call_id,
            "name": name,
            "arguments": json.dumps(arguments, separators=(",", ":")),
            "status": "completed",
        }
        pairs.append((call, {"type": "function_call_output", "call_id": call_id, "output": output}))
    return pairs


def request_body(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], *, stream: bool = False
) -> dict[str, Any]:
    """A request for the next turn of an agent session whose history holds `pairs`."""
    body: dict[str, Any] = {"model": MODEL}
    if stream:
        body["stream"] = True  # first, so the stub upstream finds it without parsing
    body["input"] = [
        {"role": "user", "content": "How did EMEA sales do last week, and where is my order?"}
    ]
    for call, output in pairs:
        body["input"] += [call, output]
    body["tools"] = TOOLS
    return body


def chat_body(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], *, stream: bool = False
) -> dict[str, Any]:
    """`request_body`'s history as Chat Completions messages: each call an assistant message's
    one `tool_calls` entry, each output a `role: "tool"` message, the tools under `function`."""
    body: dict[str, Any] = {"model": MODEL}
    if stream:
        body["stream"] = True
    body["messages"] = [
        {"role": "user", "content": "How did EMEA sales do last week, and where is my order?"}
    ]
    for call, output in pairs:
        function = {"name": call["name"], "arguments": call["arguments"]}
        entry = {"id": call["call_id"], "type": "function", "function": function}
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [entry]},
            {"role": "tool", "tool_call_id": output["call_id"], "content": output["output"]},
        ]
    body["tools"] = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS
    ]
    return body


# The question of `numbered_question`, to number: digits found nowhere else in a body.
QUESTION_NUMBER = "0000000000"


def numbered_question(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> bytes:
    """A body of `pairs` that opens with question number QUESTION_NUMBER: numbered anew for
    each request (`wrk.write_numbered_script`), no body starts with the bytes of another, so a
    proxy that holds a session's verified prefix reads each in full (the calls' verdicts stay
    cached, as with one body repeated)."""
    body = request_body(pairs)
    question = f"Question {QUESTION_NUMBER}: how did EMEA sales do last week?"
    body["input"][0] = {**body["input"][0], "content": question}
    return encode(body)


def encode(body: dict[str, Any]) -> bytes:
    """Serialise as the official SDK does (httpx: compact, non-ASCII kept as UTF-8)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def failing(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], reason: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The pairs with the middle call broken: `block` fails its schema, `strip` its JSON."""
    index = len(pairs) // 2
    if reason == "block":
        index -= index % 2  # a get_latest_sales_report call
        arguments = '{"region":"mars"}'
    else:
        index += 1 - index % 2  # a lookup_order call
        arguments = '{"order_id":"ORD-000001","order_id":"ORD-000002"}'
    call, output = pairs[index]
    broken = [*pairs]
    broken[index] = ({**call, "arguments": arguments}, output)
    return broken


def numbered(kind: str, n: int) -> bytes:
    """Request `n` of a mixed load, of `kind` (clean | strip | block | sse): a sales call and an
    order call whose arguments no other `n` sends (each a verdict the cache has not seen), the
    order call broken for `strip` and the sales call for `block` (as `failing` breaks them)."""
    pairs = iter_pairs(2, seed=n, first=2 * n)
    if kind in ("strip", "block"):
        pairs = failing(pairs, kind)
    return encode(request_body(pairs, stream=kind == "sse"))


@dataclass(frozen=True)
class Body:
    """One benchmark body: its name, the bytes sent, and what it stands for."""

    name: str
    data: bytes
    pairs: int
    kind: str  # clean | block | strip | sse
    path: str = PATH

    @property
    def kib(self) -> float:
        return len(self.data) / 1024


def bodies() -> list[Body]:
    """The bodies of issue 5: small clean, ~30 KB/10 pairs, ~1 MB/400 pairs, failing variants,
    and a small streamed request."""
    p10, p400 = iter_pairs(10), iter_pairs(400)
    return [
        Body("small", encode(request_body([])), 0, "clean"),
        Body("10 pairs", encode(request_body(p10)), 10, "clean"),
        Body("10 pairs, block", encode(request_body(failing(p10, "block"))), 10, "block"),
        Body("10 pairs, strip", encode(request_body(failing(p10, "strip"))), 10, "strip"),
        Body("400 pairs", encode(request_body(p400)), 400, "clean"),
        Body("400 pairs, block", encode(request_body(failing(p400, "block"))), 400, "block"),
        Body("400 pairs, strip", encode(request_body(failing(p400, "strip"))), 400, "strip"),
        Body("small, SSE", encode(request_body([], stream=True)), 0, "sse"),
    ]


def chat_bodies() -> list[Body]:
    """The small and 10-pair bodies as Chat Completions requests (the same history, the same
    tools): what the second dialect costs beside the first."""
    return [
        Body("small, Chat", encode(chat_body([])), 0, "clean", CHAT_PATH),
        Body("10 pairs, Chat", encode(chat_body(iter_pairs(10))), 10, "clean", CHAT_PATH),
    ]
