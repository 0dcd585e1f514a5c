"""Open Responses vocabulary: item kinds, pairing keys, and Chat Completions envelopes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FUNCTION_CALL = "function_call"
FUNCTION_CALL_OUTPUT = "function_call_output"
ITEM_REFERENCE = "item_reference"
MESSAGE = "message"
# Keys only the ledger puts on the calls it recorded (never read from a client's item): the hash
# of the tools of the request that made the call, and the parameters of the call's own tool.
RECORDED_TOOLS = "replay-proxy:tools"
RECORDED_SCHEMAS = "replay-proxy:schemas"

Item = Mapping[str, Any]


def readings(item: Item) -> frozenset[str]:
    """The kinds an item without a `type` (or with a null, empty or false one) can be read as.

    Every input item schema of the spec defaults its `type`, so a lenient server reads a
    typeless item as any schema whose other required fields it has. A null, "" or false type
    reads the same (ItemReferenceParam allows null; `item.type || default` takes any of them
    for absent). A function_call needs no `arguments`: fastresponses, a lenient server,
    defaults them to "". One reading is the item's kind, several make it ambiguous; typed
    items have none: their type is their kind.
    """
    if item.get("type"):
        return frozenset()
    found = set()
    if "id" in item:
        found.add(ITEM_REFERENCE)
    if "role" in item or "content" in item:
        found.add(MESSAGE)
    if "call_id" in item:
        if "name" in item:
            found.add(FUNCTION_CALL)
        if "output" in item:
            found.add(FUNCTION_CALL_OUTPUT)
    if "summary" in item:
        found.add("reasoning")
    if "encrypted_content" in item:
        found.add("compaction")
    return frozenset(found)


def kind(item: Any) -> str | None:
    """The item's kind: its `type`; for a typeless item, the one kind the spec's defaults read
    it as (`{"call_id", "output"}` is a function_call_output, `{"id"}` an item_reference, an
    item with `role` a message); None when it is not an object, its type is not a string, or it
    reads as no kind or as several (`is_ambiguous`).
    """
    if not isinstance(item, dict):
        return None
    item_type = item.get("type")
    if not item_type:
        # Most typeless items are plain messages: their one reading, without building them all.
        if "role" in item and _OTHER_READINGS.isdisjoint(item):
            return MESSAGE
        found = readings(item)
        return next(iter(found)) if len(found) == 1 else None
    return item_type if isinstance(item_type, str) else None


# The members that make a typeless item readable as something else than a message.
_OTHER_READINGS = frozenset({"id", "call_id", "summary", "encrypted_content"})


def is_ambiguous(item: Any) -> bool:
    """A typeless item that the spec's defaults read as more than one kind: one server would
    take it for a function_call_output where the gate sees a message, or a call for a reference."""
    return isinstance(item, dict) and len(readings(item)) > 1


def is_output(item: Any) -> bool:
    return kind(item) == FUNCTION_CALL_OUTPUT


def is_reference(item: Any) -> bool:
    return kind(item) == ITEM_REFERENCE


def reference_id(item: Item) -> str | None:
    ref = item.get("id")
    return ref if isinstance(ref, str) else None


def output_call_id(item: Item) -> str | None:
    return answered_key(item, "call_id")


def answered_key(item: Item, field: str | None) -> str | None:
    """The key an output answers its call by, held in `field` (`call_id` for most outputs)."""
    key = item.get(field) if field is not None else None
    return key if isinstance(key, str) else None


def pairing_key(item: Any) -> str | None:
    """The key under which an item answers a `call_id`: its `call_id`, else its `id`.

    Items with no `call_id` (a vendor's hosted tool call such as `openai:web_search_call`) can
    still be named by an output; pairing by `id` lets the gate see and reject that pair.
    """
    if not isinstance(item, dict):
        return None
    return pairing_key_of(item, kind(item))


def pairing_key_of(item: Item, item_kind: str | None) -> str | None:
    """`pairing_key` of an object whose `kind` is already known."""
    if item_kind in _NO_PAIRING_KEY:
        return None
    if "call_id" in item or item_kind == FUNCTION_CALL:
        call_id = item.get("call_id")
        return call_id if isinstance(call_id, str) else None
    item_id = item.get("id")
    return item_id if isinstance(item_id, str) and item_kind != MESSAGE else None


_NO_PAIRING_KEY = frozenset({FUNCTION_CALL_OUTPUT, ITEM_REFERENCE})


def is_envelope(item: Any) -> bool:
    """A Chat Completions message inside `input`: `role: tool`, `tool_calls` or `tool_call_id`."""
    if not isinstance(item, dict):
        return False
    return item.get("role") == "tool" or "tool_calls" in item or "tool_call_id" in item


def is_namespaced(item_type: Any) -> bool:
    """A vendor extension type (`openai:web_search_call`) or a type that is not a string."""
    return not isinstance(item_type, str) or ":" in item_type


def vendor_of(item_type: Any) -> str | None:
    """The vendor slug a type carries (`acme` of `acme:search_call`, before the first colon);
    None for a type without one, or that is not a string."""
    if not isinstance(item_type, str) or ":" not in item_type:
        return None
    return item_type.partition(":")[0]


NAMESPACE = "namespace"
# Input items that add tools to the request: a developer's `additional_tools`, and the tools a
# `tool_search_output` loaded.
TOOL_ITEMS = ("additional_tools", "tool_search_output")


def tool_name(call: Item) -> str | None:
    """The name a call's tool is declared under: `<namespace>/<name>` for a call that names its
    `namespace` (a function name never holds a `/`), else its `name`."""
    name = call.get("name")
    if not isinstance(name, str):
        return None
    namespace = call.get(NAMESPACE)
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def tool_schemas(tools: Any, namespace: str | None = None) -> list[tuple[str, Any]]:
    """(name, parameters) of each function tool in a request's `tools`; a function inside a
    `namespace` tool is named `<namespace>/<name>`, as `tool_name` names its calls. A deferred
    tool (`defer_loading`) is declared as any other.

    Both the Responses shape (`{"type":"function","name":…,"parameters":…}`) and the
    Chat Completions shape (`{"type":"function","function":{…}}`) are read.
    """
    found: list[tuple[str, Any]] = []
    if not isinstance(tools, list):
        return found
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind_of_tool = tool.get("type", "function")
        if kind_of_tool == "function":
            spec = tool.get("function")
            if not isinstance(spec, dict):
                spec = tool
            name = spec.get("name")
            if isinstance(name, str):
                named = name if namespace is None else f"{namespace}/{name}"
                found.append((named, spec.get("parameters")))
        elif kind_of_tool == NAMESPACE and namespace is None:
            inner = tool.get("name")
            if isinstance(inner, str) and inner:
                found.extend(tool_schemas(tool.get("tools"), inner))
    return found


def declared_tools(
    body: Item, offered: Sequence[tuple[str, Any]] | None = None
) -> list[tuple[str, Any]]:
    """(name, parameters) of every function tool the request declares: in its `tools` (their
    `tool_schemas`, `offered` when read already), and in the items of its `input` that add
    tools (`TOOL_ITEMS`)."""
    found = tool_schemas(body.get("tools")) if offered is None else list(offered)
    listed = body.get("input")
    for item in listed if isinstance(listed, list) else ():
        if isinstance(item, dict) and item.get("type") in TOOL_ITEMS:
            found.extend(tool_schemas(item.get("tools")))
    return found


MCP_LIST_TOOLS = "mcp_list_tools"


def mcp_tool_name(call: Item) -> str | None:
    """The name an MCP call's tool is listed under: `<server_label>/<name>` (a pin of that name,
    else of the bare name, wins over the list)."""
    name, label = call.get("name"), call.get("server_label")
    if not isinstance(name, str) or not isinstance(label, str):
        return None
    return f"{label}/{name}"


def mcp_tools(listed: Item) -> list[tuple[str, Any]]:
    """(`<server_label>/<name>`, input_schema) of each tool an `mcp_list_tools` item lists."""
    label, tools = listed.get("server_label"), listed.get("tools")
    if listed.get("type") != MCP_LIST_TOOLS or not isinstance(label, str):
        return []
    return [
        (f"{label}/{tool['name']}", tool.get("input_schema"))
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and isinstance(tool.get("name"), str)
    ]


ALLOWED_TOOLS = "allowed_tools"


def allowed_tools(tool_choice: Any) -> frozenset[str] | None:
    """The tools a request's `tool_choice` of type `allowed_tools` lets the model call, as
    `permitted` reads them (a function or custom tool by the name its calls are declared under,
    `mcp:<server_label>` for every tool of a server, `namespace:<name>` for every tool of a
    namespace); None when the `tool_choice` restricts nothing. The Responses shape
    (`{"type": "allowed_tools", "tools": [...]}`) and the Chat Completions one
    (`{"type": "allowed_tools", "allowed_tools": {"tools": [...]}}`) are read."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != ALLOWED_TOOLS:
        return None
    inner = tool_choice.get(ALLOWED_TOOLS)
    listed = (inner if isinstance(inner, dict) else tool_choice).get("tools")
    found: set[str] = set()
    for tool in listed if isinstance(listed, list) else ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        spec = function if isinstance(function, dict) else tool
        kind_of_tool, name = tool.get("type"), spec.get("name")
        if kind_of_tool == "mcp" and isinstance(tool.get("server_label"), str):
            found.add(f"mcp:{tool['server_label']}")
        elif kind_of_tool == NAMESPACE and isinstance(name, str):
            found.add(f"namespace:{name}")
        elif isinstance(name, str):
            found.add(name)
    return frozenset(found)


def permitted(call: Item, allowed: frozenset[str]) -> bool:
    """Whether `allowed` (see `allowed_tools`) lets the model make this call."""
    if call.get("type") == "mcp_call":
        return f"mcp:{call.get('server_label')}" in allowed
    namespace = call.get(NAMESPACE)
    if isinstance(namespace, str) and f"namespace:{namespace}" in allowed:
        return True
    return tool_name(call) in allowed
