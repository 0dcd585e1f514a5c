"""`replay-proxy check` as a user runs it: the installed script, files, stdin, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.running.documents import Document, UnreadableDocument, iter_documents
from tests.builders import ARTICLE_TOOLS as TOOLS
from tests.builders import SALES_SCHEMA as SALES
from tests.builders import WEB_SEARCH, article_output


def sales_call(call_id: str, arguments: Any, **extra: Any) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": "fc_001",
        "name": "get_latest_sales_report",
        "call_id": call_id,
        "status": "completed",
        "arguments": arguments,
    }
    return item | extra


def lookup_call(arguments: dict[str, Any]) -> dict[str, Any]:
    return sales_call("call_200", json.dumps(arguments), name="lookup_order")


def body(*input_items: Any, tools: Any = TOOLS) -> dict[str, Any]:
    return {"model": "m", "input": list(input_items), "tools": tools}


def script() -> str:
    """The installed `replay-proxy` console script, next to this interpreter or on PATH."""
    found = shutil.which("replay-proxy", path=str(Path(sys.executable).parent))
    found = found or shutil.which("replay-proxy")
    assert found is not None, "the replay-proxy console script is not installed"
    return found


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    @property
    def verdicts(self) -> list[Any]:
        return [json.loads(line) for line in self.lines]


def check(cwd: Path, *args: str, stdin: bytes = b"") -> Run:
    done = subprocess.run(
        [script(), "check", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return Run(done.returncode, done.stdout.decode(), done.stderr.decode())


def write(path: Path, data: Any) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path.name


# (paired item, call_id, human line for the output at input[1] or None, its finding in --json)
EXAMPLES = [
    pytest.param(
        sales_call("call_123", '{"region":"apac"}'),
        "call_123",
        None,
        None,
        id="sales-ok",
    ),
    pytest.param(
        sales_call("call_129", '{"region":"global"}', id="fc_009"),
        "call_129",
        "input[1] call_129 get_latest_sales_report: arguments_schema [block]: "
        "region failed schema: expected one of apac, emea, amer",
        {
            "name": "get_latest_sales_report",
            "reason": "arguments_schema",
            "pass": [],
            "fail": [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}],
        },
        id="sales-enum",
    ),
    pytest.param(
        WEB_SEARCH,
        "ws_001",
        "input[1] ws_001 -: namespaced [block]: the paired item is a vendor extension, not a "
        "portable function_call (its type is openai:web_search_call)",
        {"name": None, "reason": "namespaced"},
        id="web-search-namespaced",
    ),
    pytest.param(
        sales_call("call_1", {"region": "apac"}),
        "call_1",
        "input[1] call_1 get_latest_sales_report: arguments_type [block]: "
        "arguments must be a string of JSON but an object",
        {"name": "get_latest_sales_report", "reason": "arguments_type"},
        id="arguments-object",
    ),
    pytest.param(
        sales_call("call_1", '{"region":"apac"}', status="in_progress"),
        "call_1",
        "input[1] call_1 get_latest_sales_report: status [block]: "
        "status is in_progress: a replayed function_call must be completed",
        {"name": "get_latest_sales_report", "reason": "status"},
        id="status-in-progress",
    ),
    pytest.param(
        sales_call("call_1", '{"region":"apac"}', status="incomplete"),
        "call_1",
        "input[1] call_1 get_latest_sales_report: status [block]: "
        "status is incomplete: a replayed function_call must be completed",
        {"name": "get_latest_sales_report", "reason": "status"},
        id="status-incomplete",
    ),
    pytest.param(
        lookup_call({"order_id": "1042", "include_lines": True, "refund": True}),
        "call_200",
        "input[1] call_200 lookup_order: arguments_schema [block]: "
        "order_id failed schema: expected ^[A-Z]-\\d{4}$; "
        "refund is not allowed (additionalProperties: false)",
        {
            "name": "lookup_order",
            "reason": "arguments_schema",
            "pass": ["include_lines"],
            "fail": [
                {"path": "/order_id", "reason": "pattern", "expected": "^[A-Z]-\\d{4}$"},
                {"path": "/refund", "reason": "additionalProperties", "expected": False},
            ],
        },
        id="lookup-pattern-and-extra",
    ),
    pytest.param(
        lookup_call({"order_id": "A-1042", "include_lines": True}),
        "call_200",
        None,
        None,
        id="lookup-ok",
    ),
    pytest.param(
        lookup_call({"order_id": "A-1042"}),
        "call_200",
        "input[1] call_200 lookup_order: arguments_schema [block]: include_lines is required",
        {
            "name": "lookup_order",
            "reason": "arguments_schema",
            "pass": ["order_id"],
            "fail": [
                {
                    "path": "/include_lines",
                    "reason": "required",
                    "expected": ["order_id", "include_lines"],
                }
            ],
        },
        id="lookup-required",
    ),
]


def summary(documents: int, findings: int, dirty: int, actions: str = "") -> str:
    shown = f" ({actions})" if actions else ""
    return (
        f"{documents} document(s) in 1 file(s): {findings} finding(s){shown} in {dirty} document(s)"
    )


def finding_lines(run: Run) -> list[str]:
    """The human lines before the summary: notes and one line per finding."""
    lines = run.lines[:-1]
    return lines[: lines.index("")] if "" in lines else lines


@pytest.mark.parametrize(("paired", "call_id", "line", "finding"), EXAMPLES)
def test_article_example_human(
    tmp_path: Path, paired: Any, call_id: str, line: str | None, finding: dict[str, Any] | None
) -> None:
    name = write(tmp_path / "request.json", body(paired, article_output(call_id)))
    run = check(tmp_path, name)
    if line is None:
        assert run.lines == [summary(1, 0, 0)]
    else:
        assert finding is not None
        assert finding_lines(run) == [f"request.json: {line}"]
        assert run.lines[-2].split() == [finding["reason"], finding["name"] or "-", "1"]
        assert run.lines[-1] == summary(1, 1, 1, "1 block")
    assert run.code == (0 if finding is None else 1)
    assert run.err == ""


@pytest.mark.parametrize(("paired", "call_id", "line", "finding"), EXAMPLES)
def test_article_example_json(
    tmp_path: Path, paired: Any, call_id: str, line: str | None, finding: dict[str, Any] | None
) -> None:
    name = write(tmp_path / "request.json", body(paired, article_output(call_id)))
    run = check(tmp_path, "--json", name)
    if finding is None or line is None:
        assert (run.code, run.verdicts) == (0, [])
        return
    said = line.split("[block]: ", 1)[1]
    expected = {"index": 1, "call_id": call_id, "paired_index": 0} | finding
    assert run.verdicts == [
        {
            "file": "request.json",
            "line": None,
            "element": None,
            "kind": "request",
            "dialect": "responses",
            "where": "input[1]",
            "outcome": "block",
            "finding": expected | {"action": "block", "message": said},
        }
    ]
    assert run.code == 1


CLEAN = body(sales_call("call_1", '{"region":"apac"}'), article_output("call_1"))
DIRTY = body(sales_call("call_2", '{"region":"global"}'), article_output("call_2"))
ORPHAN_ITEMS = [{"role": "user", "content": "hi"}, article_output("call_9")]


def without_messages(lines: list[str]) -> list[str]:
    """Each finding line up to its action: the sentence after it is the messages' tables' own."""
    return [line.split("]: ", 1)[0] + "]" if "]: " in line else line for line in lines]


# (file content, finding lines up to the action, (line, reason) of each --json finding, exit)
@pytest.mark.parametrize(
    ("content", "human", "found", "code"),
    [
        pytest.param(json.dumps(CLEAN, indent=2), [], [], 0, id="pretty-printed-body"),
        pytest.param(
            f"{json.dumps(CLEAN)}\n\n{json.dumps(DIRTY)}\n{json.dumps(ORPHAN_ITEMS)}\n",
            [
                "f:3: input[1] call_2 get_latest_sales_report: arguments_schema [block]",
                "f:4: input[1] call_9 -: orphan [block]",
            ],
            [(3, "arguments_schema"), (4, "orphan")],
            1,
            id="json-lines",
        ),
        pytest.param(
            f"{json.dumps(CLEAN)}\n{json.dumps(CLEAN)}\r\n", [], [], 0, id="json-lines-clean"
        ),
        pytest.param(
            json.dumps(ORPHAN_ITEMS),
            ["f: input[1] call_9 -: orphan [block]"],
            [(None, "orphan")],
            1,
            id="bare-array",
        ),
        pytest.param(
            json.dumps({"model": "m", "input": "one user message"}), [], [], 0, id="string-input"
        ),
        pytest.param(
            json.dumps([{"role": "tool", "tool_call_id": "call_1", "content": "x"}]),
            ["f: input[0] call_1 -: envelope [block]"],
            [(None, "envelope")],
            1,
            id="envelope",
        ),
        pytest.param(
            json.dumps(
                [
                    sales_call("call_1", '{"region":"global"}'),
                    article_output("call_1") | {"tool_call_id": "call_1"},
                ]
            ),
            [
                "f: input[1] call_1 -: envelope [block]",
                "f: input[1] call_1 get_latest_sales_report: unknown_tool [block]",
            ],
            [(None, "envelope"), (None, "unknown_tool")],
            1,
            id="output-that-is-an-envelope",
        ),
    ],
)
def test_documents(
    tmp_path: Path, content: str, human: list[str], found: list[Any], code: int
) -> None:
    write(tmp_path / "f", content)
    run = check(tmp_path, "f")
    assert (without_messages(finding_lines(run)), run.code) == (human, code)
    run = check(tmp_path, "--json", "f")
    assert run.code == code
    assert [(v["line"], v["finding"]["reason"]) for v in run.verdicts] == found


def test_stdin(tmp_path: Path) -> None:
    data = f"{json.dumps(CLEAN)}\n{json.dumps(DIRTY)}\n".encode()
    run = check(tmp_path, "-", stdin=data)
    assert run.code == 1
    assert without_messages(finding_lines(run)) == [
        "<stdin>:2: input[1] call_2 get_latest_sales_report: arguments_schema [block]"
    ]
    assert run.lines[-1] == summary(2, 1, 1, "1 block")
    run = check(tmp_path, "--json", "-", stdin=json.dumps(CLEAN).encode())
    assert (run.code, run.verdicts) == (0, [])


# Files that cannot be read as request bodies: exit 2, a message naming the file and position.
UNREADABLE = [
    pytest.param(
        '{\n  "input": [\n  }\n', "bad.json: Expecting value at line 3 column 3", id="syntax"
    ),
    pytest.param(
        f'{json.dumps(CLEAN)}\n{{"input": [}}\n',
        "bad.json: line 2 column 12: Expecting value",
        id="json-lines-bad-line-2",
    ),
    pytest.param(
        f'{json.dumps(CLEAN)}\n{{"input": []}} x\n',
        "bad.json: line 2 column 15: trailing data after the JSON value",
        id="json-lines-trailing-data",
    ),
    pytest.param(
        '{"input": []} {"input": []}',
        "bad.json: trailing data after the JSON value at line 1 column 15",
        id="two-values-one-line",
    ),
    pytest.param("", "bad.json: no JSON document in the file", id="empty"),
    pytest.param("\n  \n", "bad.json: no JSON document in the file", id="blank"),
    pytest.param("5", "bad.json: not a request body, response, input_items list", id="number"),
    pytest.param('{"input": 5}', "bad.json: `input` is neither an array", id="input-number"),
    pytest.param('{"input": [], "input": []}', "bad.json: duplicate key 'input'", id="dup-key"),
    pytest.param('[{"a": NaN}]', "bad.json: NaN is not JSON", id="nan"),
]


@pytest.mark.parametrize(("content", "message"), UNREADABLE)
@pytest.mark.parametrize("mode", [[], ["--json"]], ids=["human", "json"])
def test_unreadable_file(tmp_path: Path, content: str, message: str, mode: list[str]) -> None:
    write(tmp_path / "bad.json", content)
    run = check(tmp_path, *mode, "bad.json")
    assert run.code == 2
    assert run.err.startswith(f"replay-proxy: {message}")
    # The lines before a broken one are still checked: their summary counts the broken one.
    assert run.out == "" or run.lines[-1].endswith("; 1 unreadable (named on stderr)")


def test_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_bytes(b'{"input": ["\xff"]}')
    run = check(tmp_path, "bad.json")
    assert (run.code, run.err) == (2, "replay-proxy: bad.json: invalid UTF-8 at byte 12\n")


def test_missing_file(tmp_path: Path) -> None:
    run = check(tmp_path, "nope.json")
    assert run.code == 2
    assert run.err == "replay-proxy: nope.json: cannot read: No such file or directory\n"


def test_usage_error(tmp_path: Path) -> None:
    run = check(tmp_path)
    assert run.code == 2
    assert "usage:" in run.err


CONFIG = """\
gate:
  action: {action}
tools:
  get_latest_sales_report:
{schema}
"""


def config(tmp_path: Path, schema: dict[str, Any], action: str = "block") -> str:
    indented = "\n".join("    " + line for line in json.dumps(schema, indent=2).splitlines())
    path = tmp_path / "proxy.yaml"
    path.write_text(CONFIG.format(action=action, schema=indented), encoding="utf-8")
    return path.name


@pytest.mark.parametrize(
    ("request_tools", "pinned", "action", "verdict", "code"),
    [
        pytest.param(
            [{"type": "function", "name": "get_latest_sales_report", "parameters": {}}],
            SALES,
            "block",
            {"outcome": "block", "findings": ["arguments_schema"]},
            1,
            id="pinned-stricter-wins",
        ),
        pytest.param(
            TOOLS,
            {"type": "object"},
            "block",
            {"outcome": "forward", "findings": []},
            0,
            id="pinned-looser-wins",
        ),
        pytest.param(
            [],
            SALES,
            "strip",
            {"outcome": "strip", "findings": ["arguments_schema"]},
            1,
            id="pinned-without-request-tools-strip",
        ),
        pytest.param(
            [],
            SALES | {"properties": {"region": {"type": "string"}}},
            "log",
            {"outcome": "forward", "findings": []},
            0,
            id="pinned-accepts",
        ),
    ],
)
def test_config_pinned_schema(
    tmp_path: Path,
    request_tools: list[Any],
    pinned: dict[str, Any],
    action: str,
    verdict: dict[str, Any],
    code: int,
) -> None:
    name = write(
        tmp_path / "request.json",
        body(
            sales_call("call_1", '{"region":"global"}'),
            article_output("call_1"),
            tools=request_tools,
        ),
    )
    run = check(tmp_path, "--json", "--config", config(tmp_path, pinned, action), name)
    assert run.code == code
    assert {
        "outcome": run.verdicts[0]["outcome"] if run.verdicts else "forward",
        "findings": [v["finding"]["reason"] for v in run.verdicts],
    } == verdict


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        pytest.param(
            "gate:\n  actons: {}\n", ":2:3: gate.actons: unknown key", id="misspelled-key"
        ),
        pytest.param(
            "gate:\n  action: allow\n", ":2:3: gate.action: 'allow' is not one of", id="action"
        ),
        pytest.param(
            "tools:\n  t:\n    type: 12\n",
            ":2:3: tools.t: not a valid JSON Schema",
            id="bad-schema",
        ),
        pytest.param("gate: [\n", ": not valid YAML", id="not-yaml"),
    ],
)
def test_bad_config(tmp_path: Path, yaml_text: str, message: str) -> None:
    (tmp_path / "proxy.yaml").write_text(yaml_text, encoding="utf-8")
    name = write(tmp_path / "request.json", CLEAN)
    run = check(tmp_path, "--config", "proxy.yaml", name)
    assert run.code == 2
    assert run.err.startswith(f"replay-proxy: proxy.yaml{message}")
    assert run.out == ""


def test_missing_config(tmp_path: Path) -> None:
    name = write(tmp_path / "request.json", CLEAN)
    run = check(tmp_path, "--config", "nope.yaml", name)
    assert run.code == 2
    assert run.err.startswith("replay-proxy: nope.yaml: cannot read")


def test_python_m_proxy(tmp_path: Path) -> None:
    name = write(tmp_path / "request.json", DIRTY)
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--json", name],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["outcome"] == "block"


def _message(content: str) -> dict[str, Any]:
    return {"model": "m", "input": [{"role": "user", "content": content}]}


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        pytest.param(f"{json.dumps(CLEAN)}\n{json.dumps(CLEAN)}\n", [1, 2], id="newline"),
        pytest.param(f"{json.dumps(CLEAN)}\r\n{json.dumps(CLEAN)}\r\n", [1, 2], id="crlf"),
        pytest.param(f"{json.dumps(CLEAN)}\n\n \t\r\n{json.dumps(CLEAN)}", [1, 4], id="blank"),
        *(
            pytest.param(
                json.dumps(_message(f"a{sep}b"), ensure_ascii=False) + "\n" + json.dumps(CLEAN),
                [1, 2],
                id=f"raw-u{ord(sep):04x}-inside-a-string",
            )
            # Line breaks to str.splitlines(), not to JSON Lines; JSON strings may hold them raw.
            for sep in "\u2028\u2029\x85"
        ),
    ],
)
def test_json_lines_split_on_newline_only(data: str, lines: list[int]) -> None:
    documents = list(iter_documents("f", data.encode()))
    assert all(isinstance(d, Document) for d in documents)
    assert [d.line for d in documents] == lines
    assert isinstance(documents[0], Document)
    assert documents[0].value == json.loads(data.split("\n")[0])


@pytest.mark.parametrize(
    "separator", [pytest.param(s, id=f"u{ord(s):04x}") for s in "\u2028\u2029\x85\x0c"]
)
def test_json_lines_other_line_breaks_do_not_separate_documents(separator: str) -> None:
    # JSON knows no such whitespace: two documents joined by one are one unreadable line.
    data = json.dumps(CLEAN) + "\n" + json.dumps(CLEAN) + separator + json.dumps(CLEAN)
    first, second = iter_documents("f", data.encode())
    assert isinstance(first, Document)
    assert isinstance(second, UnreadableDocument)
    assert str(second).startswith("f: line 2 column ")
    assert second.reason == "trailing data after the JSON value"
