"""Every kind of input item the openai SDK defines, sent through the real proxy to an upstream of
`vendor: openai` with the SDK as the client: a valid variant is forwarded as it was sent, each
broken one is refused with its named reason. The kinds come from the SDK's own TypedDicts (the
union `ResponseInputItemParam`): a kind this table has no row for fails the suite by name."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import typing_extensions
from aiohttp import web
from openai.types.responses import response_input_item_param

from tests.builders import SALES_TOOL, USER, sales_call, sales_output
from tests.fixture_types import Clients, ProxyFactory
from tests.gate.test_families import EXEC
from tests.servers.recording import ANSWER, Received, RecordingUpstream


def _literals(annotation: Any) -> list[str]:
    found: list[str] = []
    for arg in typing.get_args(annotation):
        found.extend([arg] if isinstance(arg, str) else _literals(arg))
    return found


def _required(hints: dict[str, Any]) -> frozenset[str]:
    # The SDK's TypedDicts are `total=False` with `Required[...]` fields, their annotations
    # strings: only the evaluated hints say which fields are required.
    return frozenset(
        name
        for name, hint in hints.items()
        if typing_extensions.get_origin(hint) in (typing.Required, typing_extensions.Required)
    )


def sdk_members() -> dict[str, list[frozenset[str]]]:
    """Each `type` of the SDK's input items, with the required keys of each TypedDict of it
    (a `message` has three)."""
    members: dict[str, list[frozenset[str]]] = {}
    for member in typing.get_args(response_input_item_param.ResponseInputItemParam):
        hints = typing.get_type_hints(member, include_extras=True)
        for item_type in _literals(hints["type"]):
            members.setdefault(item_type, []).append(_required(hints))
    return members


# The tools every request declares: the sales function, a custom tool whose input is a regex,
# one whose Lark grammar is not LALR(1) (so no call of it can be judged), the tool search that
# lets items add tools.
ADDITION = {"type": "grammar", "syntax": "regex", "definition": "^add \\d+(,\\d+)*$"}
CALC = {"type": "custom", "name": "calc", "format": ADDITION}
AMBIGUOUS = {
    "type": "grammar",
    "syntax": "lark",
    "definition": 'start: a "x" | b "x"\na: "z"\nb: "z"\n',
}
PICK = {"type": "custom", "name": "pick", "format": AMBIGUOUS}
TOOLS = [SALES_TOOL, CALC, PICK, {"type": "tool_search"}]
SCHEMA = {"type": "object", "properties": {"region": {"enum": ["apac", "emea"]}},
          "required": ["region"]}  # fmt: skip
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "crm",
          "tools": [{"name": "sales", "input_schema": SCHEMA}]}  # fmt: skip
# The item the upstream made on the first turn, which a reference names on the second.
RELAYED = {"type": "message", "id": "msg_relayed", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "42", "annotations": []}]}  # fmt: skip


def custom_call(tool_input: str) -> dict[str, Any]:
    return {"type": "custom_tool_call", "call_id": "k1", "name": "calc", "input": tool_input}


def mcp(kind: str, arguments: str, name: str = "sales") -> dict[str, Any]:
    item = {"type": kind, "id": "k1", "server_label": "crm", "name": name, "arguments": arguments}
    return item | ({"output": "42"} if kind == "mcp_call" else {})


APAC = '{"region": "apac"}'
MARS = '{"region": "mars"}'
SALES = (sales_call("k1"), sales_output("k1"))
CUSTOM = (custom_call("add 1,2"), {"type": "custom_tool_call_output", "call_id": "k1",
                                   "output": "3"})  # fmt: skip
COMPUTER = ({"type": "computer_call", "id": "cu_1", "call_id": "k1", "status": "completed",
             "action": {"type": "screenshot"}, "pending_safety_checks": []},
            {"type": "computer_call_output", "call_id": "k1",
             "output": {"type": "computer_screenshot", "image_url": "data:,"}})  # fmt: skip
LOCAL_SHELL = ({"type": "local_shell_call", "id": "ls_1", "call_id": "k1",
                "status": "completed", "action": EXEC},
               {"type": "local_shell_call_output", "id": "k1", "output": "{}"})  # fmt: skip
SHELL = ({"type": "shell_call", "call_id": "k1", "status": "completed",
          "action": {"commands": ["ls"]}},
         {"type": "shell_call_output", "call_id": "k1", "output": []})  # fmt: skip
PATCH = ({"type": "apply_patch_call", "call_id": "k1", "status": "completed",
          "operation": {"type": "delete_file", "path": "a"}},
         {"type": "apply_patch_call_output", "call_id": "k1", "status": "completed"})  # fmt: skip
SEARCH = ({"type": "tool_search_call", "call_id": "k1", "status": "completed",
           "arguments": {"query": "sales"}},
          {"type": "tool_search_output", "call_id": "k1", "status": "completed",
           "tools": [SALES_TOOL | {"name": "searched"}]})  # fmt: skip
PROGRAM = ({"type": "program", "id": "pr_1", "call_id": "k1", "code": "1", "fingerprint": "f"},
           {"type": "program_output", "id": "po_1", "call_id": "k1", "result": "1",
            "status": "completed"})  # fmt: skip
APPROVED = {"type": "mcp_approval_response", "approval_request_id": "k1", "approve": True}
APPROVAL = (mcp("mcp_approval_request", APAC), APPROVED)
ADDED = {"type": "additional_tools", "role": "developer", "tools": [SALES_TOOL | {"name": "added"}]}


def in_progress(item: dict[str, Any]) -> dict[str, Any]:
    return item | {"status": "in_progress"}


@dataclass(frozen=True)
class Broken:
    """A broken variant: its items (after the user's question), and the finding it is refused
    with as (index in `input`, reason)."""

    items: tuple[Any, ...]
    index: int
    reason: str


@dataclass(frozen=True)
class Row:
    """One kind: a valid variant (the items before it that it needs, then it and what follows),
    and its broken variants; none where the gate has no rule for the kind, only its place in
    the vocabulary (it is native to openai, and so forwarded)."""

    valid: tuple[Any, ...]
    broken: tuple[Broken, ...] = ()


def forged(output: dict[str, Any]) -> Broken:
    return Broken((output,), 1, "orphan")


def started(call: dict[str, Any], output: dict[str, Any]) -> Broken:
    return Broken((in_progress(call), output), 2, "status")


def twice(call: dict[str, Any], output: dict[str, Any]) -> Broken:
    return Broken((call, call | {"id": "again"}, output), 3, "duplicate_call_id")


ROWS: dict[str, Row] = {
    "message": Row(({"type": "message", "role": "user", "content": "and EMEA?"},)),
    "item_reference": Row(
        ({"type": "item_reference", "id": RELAYED["id"]},),
        (Broken(({"type": "item_reference", "id": "msg_never"},), 1, "unknown_reference"),),
    ),
    "function_call": Row(
        SALES, (Broken((sales_call("k1", "mars"), SALES[1]), 2, "arguments_schema"), twice(*SALES))
    ),
    "function_call_output": Row(SALES, (forged(SALES[1]),)),
    "custom_tool_call": Row(
        CUSTOM,
        (
            Broken((custom_call("add 1,x"), CUSTOM[1]), 2, "input_grammar"),
            Broken((custom_call("zx") | {"name": "pick"}, CUSTOM[1]), 2, "input_grammar"),
            Broken((custom_call("x") | {"name": "nope"}, CUSTOM[1]), 2, "unknown_tool"),
            twice(*CUSTOM),
        ),
    ),
    "custom_tool_call_output": Row(CUSTOM, (forged(CUSTOM[1]),)),
    "computer_call": Row(COMPUTER, (started(*COMPUTER), twice(*COMPUTER))),
    "computer_call_output": Row(COMPUTER, (forged(COMPUTER[1]),)),
    "local_shell_call": Row(LOCAL_SHELL, (started(*LOCAL_SHELL), twice(*LOCAL_SHELL))),
    "local_shell_call_output": Row(LOCAL_SHELL, (forged(LOCAL_SHELL[1]),)),
    "shell_call": Row(SHELL, (started(*SHELL), twice(*SHELL))),
    "shell_call_output": Row(SHELL, (forged(SHELL[1]),)),
    "apply_patch_call": Row(PATCH, (started(*PATCH), twice(*PATCH))),
    "apply_patch_call_output": Row(PATCH, (forged(PATCH[1]),)),
    "tool_search_call": Row(SEARCH, (started(*SEARCH), twice(*SEARCH))),
    # The tools it returns declare a function a later call is judged by.
    "tool_search_output": Row(
        (*SEARCH, sales_call("s1", name="searched"), sales_output("s1")),
        (
            forged(SEARCH[1]),
            Broken(
                (*SEARCH, sales_call("s1", "mars", name="searched"), sales_output("s1")),
                4,
                "arguments_schema",
            ),
        ),
    ),
    "program": Row(PROGRAM, (twice(*PROGRAM),)),
    "program_output": Row(PROGRAM, (forged(PROGRAM[1]),)),
    "mcp_list_tools": Row((LISTED,)),
    "mcp_call": Row(
        (LISTED, mcp("mcp_call", APAC)),
        (
            Broken((LISTED, mcp("mcp_call", MARS)), 2, "arguments_schema"),
            Broken((LISTED, mcp("mcp_call", APAC, "nope")), 2, "unknown_tool"),
            Broken((mcp("mcp_call", APAC),), 1, "unknown_tool"),
            Broken((LISTED, mcp("mcp_call", '{"region": "apac",}')), 2, "arguments_parse"),
        ),
    ),
    "mcp_approval_request": Row(
        (LISTED, *APPROVAL),
        (Broken((LISTED, mcp("mcp_approval_request", MARS), APPROVAL[1]), 3, "arguments_schema"),),
    ),
    "mcp_approval_response": Row((LISTED, *APPROVAL), (forged(APPROVAL[1]),)),
    # The tools it adds declare a function a later call is judged by.
    "additional_tools": Row(
        (ADDED, sales_call("a1", name="added"), sales_output("a1")),
        (
            Broken(
                (ADDED, sales_call("a1", "mars", name="added"), sales_output("a1")),
                3,
                "arguments_schema",
            ),
        ),
    ),
    "file_search_call": Row(
        ({"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},)
    ),
    "web_search_call": Row(
        (
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "q"},
            },
        )
    ),
    "image_generation_call": Row(
        ({"type": "image_generation_call", "id": "ig_1", "result": None, "status": "completed"},)
    ),
    "code_interpreter_call": Row(
        (
            {
                "type": "code_interpreter_call",
                "id": "ci_1",
                "code": "1",
                "container_id": "c",
                "outputs": None,
                "status": "completed",
            },
        )
    ),
    "configuration_update": Row(({"type": "configuration_update"},)),
    "reasoning": Row(({"type": "reasoning", "id": "rs_1", "summary": []},)),
    "compaction": Row(({"type": "compaction", "encrypted_content": "e"},)),
    "compaction_trigger": Row(({"type": "compaction_trigger"},)),
}


def kind_of(row_items: tuple[Any, ...], kind: str) -> list[dict[str, Any]]:
    return [item for item in row_items if item.get("type") == kind]


def test_every_kind_of_the_sdk_has_a_row() -> None:
    missing = sdk_members().keys() - ROWS.keys()
    assert not missing, f"no row for the SDK's kinds {sorted(missing)}"
    assert ROWS.keys() - sdk_members().keys() == set(), "a row for a kind the SDK lacks"


@pytest.mark.parametrize("kind", sorted(sdk_members()))
def test_each_valid_variant_is_an_item_the_sdk_accepts(kind: str) -> None:
    """The valid variant holds an item of its kind carrying every required key of one of the
    kind's TypedDicts."""
    assert kind in ROWS, f"no row for the SDK's kind {kind}"
    [item, *_] = kind_of(ROWS[kind].valid, kind) or [ROWS[kind].valid[0]]
    assert any(required <= item.keys() for required in sdk_members()[kind]), item


def variants() -> list[Any]:
    found = []
    for kind in sorted(sdk_members()):
        row = ROWS.get(kind, Row(()))
        found.append(pytest.param(kind, row.valid, None, id=f"{kind}-valid"))
        for n, broken in enumerate(row.broken):
            found.append(pytest.param(kind, broken.items, broken, id=f"{kind}-{broken.reason}-{n}"))
    return found


async def answer_relayed(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response(ANSWER | {"output": [RELAYED]})


@pytest.mark.parametrize(("kind", "items", "broken"), variants())
async def test_every_kind_through_the_proxy(
    recording_upstream: RecordingUpstream,
    start_routed: ProxyFactory,
    client_for: Clients,
    kind: str,
    items: tuple[Any, ...],
    broken: Broken | None,
) -> None:
    assert kind in ROWS, f"no row for the SDK's kind {kind}"
    openai_upstream = {"url": recording_upstream.url, "vendor": "openai"}
    client = client_for(
        await start_routed(upstreams={"up": openai_upstream}, routes=[{"upstream": "up"}])
    )
    recording_upstream.handler = answer_relayed
    # The first turn: the upstream makes the item a reference names.
    await client.responses.create(model="m", input="hi")
    input_items: list[Any] = [USER, *items]
    tools: list[Any] = TOOLS

    if broken is None:
        await client.responses.create(model="m", input=input_items, tools=tools)
        [_, received] = recording_upstream.received
        assert received.json() == {"model": "m", "input": input_items, "tools": tools}
        return
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="m", input=input_items, tools=tools)

    assert isinstance(raised.value.body, dict)
    found = [(f["index"], f["reason"]) for f in raised.value.body["findings"]]
    assert found == [(broken.index, broken.reason)]
    assert len(recording_upstream.received) == 1
