"""Every call and output family of the vocabulary is paired (vendor openai): orphan,
duplicate_call_id, the call's kind, and status where the call carries one."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.findings import message as sentence
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect, rejection
from tests.builders import TOOLS, message, request
from tests.gate.ledger_double import Ledger

EXEC = {"type": "exec", "command": ["ls"], "env": {}}
# Each family: (a completed call with key "k1", its output answering "k1")
FAMILIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "custom_tool_call": (
        {"type": "custom_tool_call", "call_id": "k1", "name": "patch", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "k1", "output": "done"},
    ),
    "computer_call": (
        {"type": "computer_call", "id": "cu_1", "call_id": "k1", "status": "completed",
         "action": {"type": "screenshot"}, "pending_safety_checks": []},
        {"type": "computer_call_output", "call_id": "k1",
         "output": {"type": "computer_screenshot", "image_url": "data:,"}},
    ),
    "local_shell_call": (
        {"type": "local_shell_call", "id": "ls_1", "call_id": "k1", "status": "completed",
         "action": EXEC},
        {"type": "local_shell_call_output", "id": "k1", "output": "{}"},
    ),
    "shell_call": (
        {"type": "shell_call", "call_id": "k1", "status": "completed",
         "action": {"commands": ["ls"]}},
        {"type": "shell_call_output", "call_id": "k1", "output": []},
    ),
    "apply_patch_call": (
        {"type": "apply_patch_call", "call_id": "k1", "status": "completed",
         "operation": {"type": "delete_file", "path": "a"}},
        {"type": "apply_patch_call_output", "call_id": "k1", "status": "completed"},
    ),
    "mcp_approval_request": (
        {"type": "mcp_approval_request", "id": "k1", "server_label": "crm", "name": "sales",
         "arguments": "{}"},
        {"type": "mcp_approval_response", "approval_request_id": "k1", "approve": True},
    ),
    "tool_search_call": (
        {"type": "tool_search_call", "call_id": "k1", "status": "completed", "arguments": {}},
        {"type": "tool_search_output", "call_id": "k1", "status": "completed", "tools": []},
    ),
}  # fmt: skip
WITH_STATUS = [k for k, (call, _) in FAMILIES.items() if "status" in call]
# The tools the calls with arguments or input are judged by: a custom tool taking any text, and
# the MCP tool a list of the recorded chain names.
PATCH_TOOL = {"type": "custom", "name": "patch", "format": {"type": "text"}}
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "crm",
          "tools": [{"name": "sales", "input_schema": {"type": "object"}}]}  # fmt: skip


def verdict_of(*input_items: Any, vendor: str | None = "openai") -> list[tuple[Any, str]]:
    body = request(message("hi"), *input_items, tools=[*TOOLS, PATCH_TOOL])
    verdict = inspect(body, Policy(vendor=vendor), Ledger([LISTED]))
    return [(f.index, f.reason) for f in verdict.findings]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pair_passes(family: str) -> None:
    assert verdict_of(*FAMILIES[family]) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_a_forged_output_is_an_orphan(family: str) -> None:
    assert verdict_of(FAMILIES[family][1]) == [(1, "orphan")]


@pytest.mark.parametrize("family", FAMILIES)
def test_without_a_vendor_nothing_changes(family: str) -> None:
    assert verdict_of(FAMILIES[family][1], vendor=None) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_two_calls_are_a_duplicate_call_id(family: str) -> None:
    call, output = FAMILIES[family]
    assert verdict_of(call, call | {"x": 1}, output) == [(3, "duplicate_call_id")]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_of_another_family_is_not_its_call(family: str) -> None:
    other = {"type": "function_call", "call_id": "k1", "name": "f", "arguments": "{}"}
    assert verdict_of(other, FAMILIES[family][1]) == [(2, "not_function_call")]


@pytest.mark.parametrize("family", WITH_STATUS)
def test_a_call_still_in_progress_is_status(family: str) -> None:
    call, output = FAMILIES[family]
    assert verdict_of(call | {"status": "in_progress"}, output) == [(2, "status")]


def test_a_custom_tool_call_carries_no_status() -> None:
    call, output = FAMILIES["custom_tool_call"]
    assert "status" not in call
    assert verdict_of(call, output) == []


def test_the_sentences_name_the_family() -> None:
    body = request(message("hi"), FAMILIES["shell_call"][1])
    verdict = inspect(body, Policy(vendor="openai"), Ledger())
    [finding] = verdict.findings
    assert sentence(finding).startswith("no shell_call with call_id k1 precedes this output")
    assert rejection(verdict)["error"]["message"] == (
        "input[1] (call_id k1): no shell_call with this call_id precedes it: orphan"
    )
    call, output = FAMILIES["shell_call"]
    body = request(message("hi"), call | {"status": "in_progress"}, output)
    [finding] = inspect(body, Policy(vendor="openai"), Ledger()).findings
    assert sentence(finding) == "status is in_progress: a replayed shell_call must be completed"


def test_strip_takes_the_pair() -> None:
    call, output = FAMILIES["local_shell_call"]
    body = request(message("hi"), call | {"status": "incomplete"}, output)
    verdict = inspect(body, Policy(vendor="openai", action="strip"), Ledger())
    assert verdict.input == [message("hi")]


@pytest.mark.parametrize(
    ("family", "kept"),
    [
        ("custom_tool_call", "rewrite"),
        *((family, "block") for family in FAMILIES if family != "custom_tool_call"),
    ],
)
def test_a_rewrite_is_kept_only_where_the_record_fits(family: str, kept: str) -> None:
    """A pair no upstream emitted, under `require_provenance` and `rewrite`: a custom tool's
    output becomes the failure record, as a function call's does; any other family's (a
    screenshot, a shell's list, an approval without its `approval_request_id`) is blocked
    instead of being left without its own fields or its pair."""
    call, output = FAMILIES[family]
    policy = Policy(vendor="openai", action="rewrite", require_provenance=True)
    verdict = inspect(request(message("hi"), call, output), policy, Ledger())
    assert [f.reason for f in verdict.findings] == ["provenance"]
    assert verdict.outcome == kept
    if kept == "rewrite":
        assert verdict.input is not None
        [_, _, rewritten] = verdict.input
        assert set(rewritten) == {"type", "call_id", "output"}
        assert rewritten["type"] == "custom_tool_call_output"
        assert '"execute":false' in rewritten["output"].replace(" ", "")
