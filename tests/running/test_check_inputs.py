"""`replay-proxy check` on what people have: each kind of input through the installed CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.running.check import CHAT_DOCUMENT
from tests.builders import ARTICLE_TOOLS as TOOLS
from tests.builders import SALES_SCHEMA, article_output
from tests.running.test_check import CLEAN, DIRTY, check, sales_call

GLOBAL = '{"region":"global"}'
ORPHAN = (
    "no function_call with call_id call_9 precedes this output: not inline, not behind an "
    "item_reference, not in the previous_response_id chain the proxy recorded"
)
CHAT_ORPHAN = (
    "no tool_calls entry with id call_9 in an earlier assistant message: this tool message "
    "answers no call"
)
ITEM_IN_MESSAGES = (
    "an Open Responses item (function_call, function_call_output, item_reference) inside "
    "messages: Chat Completions carries assistant tool_calls and role: tool messages instead"
)
ACTION = re.compile(r" \[(?:block|strip|rewrite|log)\]: (.*)$")
ENUM = "region failed schema: expected one of apac, emea, amer"
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_latest_sales_report", "parameters": SALES_SCHEMA},
    }
]


def chat_call(call_id: str, arguments: str) -> dict[str, Any]:
    function = {"name": "get_latest_sales_report", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def chat_json(call: dict[str, Any], answered: str) -> str:
    """A Chat body with one call and one tool message answering `answered`."""
    messages = [
        {"role": "user", "content": "APAC?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": answered, "content": "report"},
    ]
    return json.dumps({"model": "gpt", "tools": CHAT_TOOLS, "messages": messages})


def response(*output: Any, tools: Any = TOOLS, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "m",
        "tools": tools,
        "output": list(output),
    } | extra


ASSISTANT = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "x"}],
}
BAD_CALL = sales_call("call_7", GLOBAL)
GOOD_CALL = sales_call("call_8", '{"region":"emea"}')


def audit(*findings: dict[str, Any], event: str = "replay_rejected") -> dict[str, Any]:
    return {
        "ts": "2026-04-24T10:00:00.000Z",
        "event": event,
        "request_id": "req_1",
        "action": "block",
        "transport": "http",
        "upstream": "default",
        "path": "/v1/responses",
        "model": "m",
        "previous_response_id": None,
        "tenant": None,
        "body_sha256": "0" * 64,
        "findings": list(findings),
        "prev": "0" * 64,
    }


SCHEMA_FINDING = {
    "index": 1,
    "call_id": "call_2",
    "paired_index": 0,
    "name": "get_latest_sales_report",
    "reason": "arguments_schema",
    "pass": [],
    "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
}
ORPHAN_FINDING = {
    "index": 0,
    "call_id": "call_9",
    "paired_index": None,
    "name": None,
    "reason": "orphan",
}


def lines(*values: Any) -> str:
    return "".join(json.dumps(v) + "\n" for v in values)


# (files: name -> content, extra arguments, finding lines, (file, line, where, reason) of each
# --json finding, the exit code)
INPUTS = [
    pytest.param(
        {"f.json": json.dumps(DIRTY)},
        [],
        [f"f.json: input[1] call_2 get_latest_sales_report: arguments_schema [block]: {ENUM}"],
        [("f.json", None, "input[1]", "arguments_schema")],
        1,
        id="request-body",
    ),
    pytest.param(
        {"f.json": json.dumps([CLEAN, DIRTY, CLEAN], indent=2)},
        [],
        [f"f.json[1]: input[1] call_2 get_latest_sales_report: arguments_schema [block]: {ENUM}"],
        # The element's own line in the pretty-printed array.
        [
            (
                "f.json",
                2 + len(json.dumps(CLEAN, indent=2).splitlines()),
                "input[1]",
                "arguments_schema",
            )
        ],
        1,
        id="json-array-of-bodies",
    ),
    pytest.param(
        {"f.jsonl": lines(CLEAN, DIRTY) + '{"input": [}\n' + lines(DIRTY)},
        [],
        [
            f"f.jsonl:2: input[1] call_2 get_latest_sales_report: arguments_schema [block]: {ENUM}",
            f"f.jsonl:4: input[1] call_2 get_latest_sales_report: arguments_schema [block]: {ENUM}",
        ],
        [
            ("f.jsonl", 2, "input[1]", "arguments_schema"),
            ("f.jsonl", 4, "input[1]", "arguments_schema"),
        ],
        2,
        id="json-lines-broken-line-in-the-middle",
    ),
    pytest.param(
        {"log.jsonl": lines({"ts": "2026-04-24T10:00:00Z", "level": "info", "request": DIRTY})},
        [],
        [
            (
                "log.jsonl:1: request.input[1] call_2 get_latest_sales_report: arguments_schema "
                f"[block]: {ENUM}"
            )
        ],
        [("log.jsonl", 1, "request.input[1]", "arguments_schema")],
        1,
        id="log-line-request",
    ),
    pytest.param(
        {"log.jsonl": lines({"ts": 1, "body": json.dumps(DIRTY)}, {"ts": 2, "params": CLEAN})},
        [],
        [
            (
                "log.jsonl:1: body.input[1] call_2 get_latest_sales_report: arguments_schema "
                f"[block]: {ENUM}"
            )
        ],
        [("log.jsonl", 1, "body.input[1]", "arguments_schema")],
        1,
        id="log-line-body-as-a-string-and-params",
    ),
    pytest.param(
        {"log.jsonl": lines({"request": {"method": "POST", "body": DIRTY}})},
        [],
        [
            (
                "log.jsonl:1: request.body.input[1] call_2 get_latest_sales_report: "
                f"arguments_schema [block]: {ENUM}"
            )
        ],
        [("log.jsonl", 1, "request.body.input[1]", "arguments_schema")],
        1,
        id="log-line-nested",
    ),
    pytest.param(
        {
            "log.jsonl": lines(
                {"request": CLEAN, "response": response(ASSISTANT, BAD_CALL, tools=[])}
            )
        },
        [],
        [
            (
                "log.jsonl:1: response.output[1] call_7 get_latest_sales_report: arguments_schema "
                f"[block]: {ENUM}"
            )
        ],
        [("log.jsonl", 1, "response.output[1]", "arguments_schema")],
        1,
        id="log-line-response-judged-by-its-request-tools",
    ),
    pytest.param(
        {"resp.json": json.dumps(response(ASSISTANT, GOOD_CALL, BAD_CALL), indent=2)},
        [],
        [f"resp.json: output[2] call_7 get_latest_sales_report: arguments_schema [block]: {ENUM}"],
        [("resp.json", None, "output[2]", "arguments_schema")],
        1,
        id="response",
    ),
    pytest.param(
        {"resp.json": json.dumps(response(BAD_CALL, tools=[]))},
        [],
        [
            (
                "resp.json: output[0] call_7 get_latest_sales_report: unknown_tool [block]: no "
                "schema for tool get_latest_sales_report: pin one under tools: or send it in the "
                "request's tools"
            )
        ],
        [("resp.json", None, "output[0]", "unknown_tool")],
        1,
        id="response-without-tools",
    ),
    pytest.param(
        {"resp.json": json.dumps(response(BAD_CALL, tools=[]))},
        ["--config", "proxy.yaml"],
        [f"resp.json: output[0] call_7 get_latest_sales_report: arguments_schema [strip]: {ENUM}"],
        [("resp.json", None, "output[0]", "arguments_schema")],
        1,
        id="response-against-pinned-schemas",
    ),
    pytest.param(
        {"resp.json": json.dumps(response(sales_call("call_6", GLOBAL, status="in_progress")))},
        [],
        [
            (
                "resp.json: output[0] call_6 get_latest_sales_report: status [block]: status is "
                "in_progress: a replayed function_call must be completed"
            )
        ],
        [("resp.json", None, "output[0]", "status")],
        1,
        id="response-call-in-progress",
    ),
    pytest.param(
        {"x.jsonl": lines(CLEAN | {"output": [ASSISTANT, BAD_CALL]})},
        [],
        [f"x.jsonl:1: output[1] call_7 get_latest_sales_report: arguments_schema [block]: {ENUM}"],
        [("x.jsonl", 1, "output[1]", "arguments_schema")],
        1,
        id="log-line-of-an-exchange-input-and-output",
    ),
    pytest.param(
        {"resp.json": json.dumps(response({k: v for k, v in BAD_CALL.items() if k != "call_id"}))},
        [],
        [f"resp.json: output[0] - get_latest_sales_report: arguments_schema [block]: {ENUM}"],
        [("resp.json", None, "output[0]", "arguments_schema")],
        1,
        id="response-call-without-call-id",
    ),
    pytest.param(
        {"resp.json": json.dumps(response(ASSISTANT, GOOD_CALL))},
        [],
        [],
        [],
        0,
        id="response-clean",
    ),
    pytest.param(
        {
            "items.json": json.dumps(
                {
                    "object": "list",
                    "data": [{"role": "user", "content": "hi"}, BAD_CALL, article_output("call_7")],
                    "first_id": "msg_1",
                    "last_id": "fco_1",
                    "has_more": False,
                }
            )
        },
        ["--config", "proxy.yaml"],
        [f"items.json: data[2] call_7 get_latest_sales_report: arguments_schema [strip]: {ENUM}"],
        [("items.json", None, "data[2]", "arguments_schema")],
        1,
        id="input-items-oldest-first",
    ),
    pytest.param(
        {
            "items.json": json.dumps(
                {
                    "object": "list",
                    "data": [article_output("call_7"), BAD_CALL, {"role": "user", "content": "hi"}],
                    "has_more": False,
                }
            )
        },
        ["--config", "proxy.yaml"],
        [
            "items.json: an input_items list, read newest first (the API's default order)",
            f"items.json: data[0] call_7 get_latest_sales_report: arguments_schema [strip]: {ENUM}",
        ],
        [("items.json", None, "data[0]", "arguments_schema")],
        1,
        id="input-items-newest-first",
    ),
    pytest.param(
        {"audit.jsonl": lines(audit(SCHEMA_FINDING), audit(ORPHAN_FINDING))},
        [],
        [
            (
                "audit.jsonl:1: input[1] call_2 get_latest_sales_report: arguments_schema "
                f"[block]: {ENUM}"
            ),
            (
                "audit.jsonl:2: input[0] call_9 -: orphan [block]: no function_call with call_id "
                "call_9 precedes this output: not inline, not behind an item_reference, not in the "
                "previous_response_id chain the proxy recorded"
            ),
        ],
        [
            ("audit.jsonl", 1, "input[1]", "arguments_schema"),
            ("audit.jsonl", 2, "input[0]", "orphan"),
        ],
        1,
        id="audit-log-as-recorded",
    ),
    pytest.param(
        {
            "audit.jsonl": lines(
                audit(SCHEMA_FINDING | {"arguments": GLOBAL}),
                audit(SCHEMA_FINDING | {"arguments": '{"region":"emea"}'}),
                audit(
                    SCHEMA_FINDING
                    | {"reason": "unknown_tool", "arguments": '{"region":"a","region":"b"}'}
                ),
            )
        },
        ["--config", "proxy.yaml"],
        [
            (
                "audit.jsonl:1: input[1] call_2 get_latest_sales_report: arguments_schema "
                f"[strip]: {ENUM}"
            ),
            (
                "audit.jsonl:2: input[1]: recorded arguments_schema, and its arguments pass the "
                "pinned schema of get_latest_sales_report now"
            ),
            (
                "audit.jsonl:3: input[1] call_2 get_latest_sales_report: arguments_parse [strip]: "
                "arguments are not one strict JSON value: duplicate key 'region' in the object at "
                "line 1 column 1"
            ),
        ],
        [
            ("audit.jsonl", 1, "input[1]", "arguments_schema"),
            ("audit.jsonl", 3, "input[1]", "arguments_parse"),
        ],
        1,
        id="audit-log-judged-again-with-its-arguments",
    ),
    pytest.param(
        {"chat.json": chat_json(chat_call("call_1", GLOBAL), "call_1")},
        [],
        [
            (f"chat.json: {CHAT_DOCUMENT}"),
            (
                "chat.json: messages[2] call_1 get_latest_sales_report: "
                f"arguments_schema [block]: {ENUM}"
            ),
        ],
        [("chat.json", None, "messages[2]", "arguments_schema")],
        1,
        id="chat-completions",
    ),
    pytest.param(
        {"chat.json": chat_json(chat_call("call_1", GLOBAL), "call_9")},
        [],
        [
            (f"chat.json: {CHAT_DOCUMENT}"),
            (f"chat.json: messages[2] call_9 -: orphan [block]: {CHAT_ORPHAN}"),
            (
                "chat.json: messages[1].tool_calls[0] call_1 get_latest_sales_report: "
                f"arguments_schema [block]: {ENUM}"
            ),
        ],
        [
            ("chat.json", None, "messages[2]", "orphan"),
            ("chat.json", None, "messages[1].tool_calls[0]", "arguments_schema"),
        ],
        1,
        id="chat-completions-an-orphan-and-a-call-not-answered-yet",
    ),
    pytest.param(
        {"chat.json": json.dumps({"model": "gpt", "messages": [{"role": "user", "content": "x"}]})},
        [],
        [(f"chat.json: {CHAT_DOCUMENT}")],
        [],
        0,
        id="chat-completions-without-tools",
    ),
    pytest.param(
        {
            "chat.json": json.dumps(
                {
                    "model": "gpt",
                    "messages": [
                        {"role": "user", "content": "x"},
                        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
                    ],
                }
            )
        },
        [],
        [
            (f"chat.json: {CHAT_DOCUMENT}"),
            (f"chat.json: messages[1] call_1 -: envelope [block]: {ITEM_IN_MESSAGES}"),
        ],
        [("chat.json", None, "messages[1]", "envelope")],
        1,
        id="chat-completions-with-an-open-responses-item",
    ),
    pytest.param(
        {
            "follow.json": json.dumps(
                {"model": "m", "previous_response_id": "resp_1", "input": [article_output("c9")]}
            )
        },
        [],
        [
            (
                "follow.json: input[0] c9 -: orphan [block]: no function_call with call_id c9 "
                "precedes this output: not inline, not behind an item_reference, not in the "
                "previous_response_id chain the proxy recorded; the paired item may be only in "
                "the ledger (previous_response_id resp_1), which check cannot see: pass --ledger "
                "redis://... (and --tenant)"
            )
        ],
        [("follow.json", None, "input[0]", "orphan")],
        1,
        id="follow-up-offline",
    ),
]

PINNED = f"""\
gate:
  action: strip
tools:
  get_latest_sales_report: {json.dumps(SALES_SCHEMA)}
"""


def _check(tmp_path: Path, files: dict[str, str], args: list[str], *mode: str) -> Any:
    (tmp_path / "proxy.yaml").write_text(PINNED, encoding="utf-8")
    for name, content in files.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    return check(tmp_path, *mode, *args, *files)


@pytest.mark.parametrize(("files", "args", "human", "found", "code"), INPUTS)
def test_input_kind_human(
    tmp_path: Path,
    files: dict[str, str],
    args: list[str],
    human: list[str],
    found: list[Any],
    code: int,
) -> None:
    run = _check(tmp_path, files, args)
    summary = run.lines[-1]
    body = run.lines[:-1]
    assert (body[: body.index("")] if "" in body else body) == human
    assert f": {len(found)} finding(s)" in summary
    assert run.code == code


@pytest.mark.parametrize(("files", "args", "human", "found", "code"), INPUTS)
def test_input_kind_json(
    tmp_path: Path,
    files: dict[str, str],
    args: list[str],
    human: list[str],
    found: list[Any],
    code: int,
) -> None:
    run = _check(tmp_path, files, args, "--json")
    got = [(v["file"], v["line"], v["where"], v["finding"]["reason"]) for v in run.verdicts]
    assert got == found
    # Each --json finding has the sentence its human line ends with.
    said = [m.group(1) for m in map(ACTION.search, human) if m is not None]
    assert [v["finding"]["message"] for v in run.verdicts] == said
    assert run.code == code


def test_several_files_globs_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "a.json").write_text(json.dumps(DIRTY), encoding="utf-8")
    (tmp_path / "logs" / "x.jsonl").write_text(lines(CLEAN, DIRTY), encoding="utf-8")
    (tmp_path / "logs" / "y.jsonl").write_text(lines(DIRTY), encoding="utf-8")
    run = check(
        tmp_path, "a.json", "logs/*.jsonl", "-", "none*.json", stdin=json.dumps(DIRTY).encode()
    )
    where = [line.split(": input[1]")[0] for line in run.lines if ": input[1] " in line]
    assert where == ["a.json", "logs/x.jsonl:2", "logs/y.jsonl:1", "<stdin>"]
    assert run.lines[-1] == (
        "5 document(s) in 4 file(s): 4 finding(s) (4 block) in 4 document(s); "
        "1 unreadable (named on stderr)"
    )
    assert run.err == "replay-proxy: none*.json: no file matches\n"
    assert run.code == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            '{"ts": 1, "msg": "hello"}',
            "f.json: not a request body, response, input_items list, audit record, Chat "
            "Completions body, MCP JSON-RPC message or array of items (a log line is read when "
            "it wraps one under "
            "request, body, params)",
            id="log-line-of-something-else",
        ),
        pytest.param(
            '{"request": "not json"}', "f.json: not a request body", id="wrapped-non-json-string"
        ),
        pytest.param('"text"', "f.json: not a request body", id="a-string"),
    ],
)
def test_a_shape_check_does_not_know_is_unreadable_not_clean(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "f.json").write_text(content, encoding="utf-8")
    run = check(tmp_path, "f.json")
    assert (run.code, run.out) == (2, "")
    assert run.err.startswith(f"replay-proxy: {message}")


def test_help_names_the_exit_codes(tmp_path: Path) -> None:
    run = check(tmp_path, "--help")
    assert run.code == 0
    assert "exit codes: 0 every document read and clean, 1 findings, 2 some input" in run.out
