"""The audit log's hash chain as the writer leaves it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from proxy.state.audit import GENESIS, AuditedRequest, AuditLog, line_hash
from tests.builders import AUDIT_FIELDS
from tests.state.audit_logs import (
    ORPHAN,
    ORPHAN_BODY,
    assert_chain,
    fresh_log,
    replay_proxy,
    write_records,
)


def test_record_has_the_design_fields_and_a_fresh_chain_starts_at_zeros(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    entry = log.write(
        AuditedRequest("req_1", "http", "/v1/responses", ORPHAN_BODY, b"{}", None), ORPHAN
    )
    log.close()

    [line] = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    assert json.loads(line) == entry
    assert set(entry) == AUDIT_FIELDS
    assert entry["prev"] == GENESIS == "0" * 64


# The last line of the second case is longer than the block the tail is read back in.
BIG_ARGUMENTS = json.dumps({"q": "x" * 200_000})
BIG_BODY = {
    "model": "m",
    "input": [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "search",
            "status": "completed",
            "arguments": BIG_ARGUMENTS,
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
    ],
}


@pytest.mark.parametrize(
    ("body", "min_line"),
    [
        pytest.param(ORPHAN_BODY, 0, id="short-lines"),
        pytest.param(BIG_BODY, 200_000, id="last-line-longer-than-a-tail-block"),
    ],
)
def test_chain_continues_across_restarts(tmp_path: Path, body: Any, min_line: int) -> None:
    path = tmp_path / "audit.jsonl"
    verdict = inspect(body, Policy())
    assert verdict.findings
    for tag, n in (("first", 3), ("second", 2), ("third", 1)):
        log = AuditLog(str(path), include_arguments=True)
        write_records(log, n, tag=tag, body=body, verdict=verdict)
        log.close()

    lines = path.read_bytes().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [
        "first_0", "first_1", "first_2", "second_0", "second_1", "third_0"
    ]  # fmt: skip
    assert min(len(line) for line in lines) > min_line
    assert_chain(lines)


def test_stdout_keeps_a_chain_per_process(capfd: pytest.CaptureFixture[str]) -> None:
    log = AuditLog("-")
    write_records(log, 3)
    lines = capfd.readouterr().out.encode().splitlines()
    assert len(lines) == 3
    assert_chain(lines)


def test_a_line_cut_short_keeps_its_place_and_verify_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines = fresh_log(path, 2)
    cut = lines[1][:40]
    path.write_bytes(lines[0] + b"\n" + cut)  # a crash in the middle of the second write

    log = AuditLog(str(path))
    write_records(log, 2, tag="after")
    log.close()

    after = path.read_bytes().splitlines()
    assert after[:2] == [lines[0], cut]
    assert json.loads(after[2])["prev"] == line_hash(cut)
    assert_chain(after[2:], start=line_hash(cut))
    done = replay_proxy("audit", "verify", str(path))
    assert done.returncode == 1
    assert done.stdout == f"{path}: line 2: not JSON\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"max_bytes": 0}, "max_bytes: 0 is not positive", id="max_bytes"),
        pytest.param({"keep": 0}, "keep: 0 is less than 1", id="keep"),
    ],
)
def test_bad_rotation_settings_are_refused(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AuditLog(str(tmp_path / "audit.jsonl"), **kwargs)
