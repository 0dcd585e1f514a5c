"""The gate offline: judge each document `check` read, and report every finding with its
sentence, then a summary by reason and tool."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.admission.dialect import CHAT_COMPLETIONS, label_of
from proxy.gate import items
from proxy.gate.caches import GateCaches
from proxy.gate.findings import Finding, message
from proxy.gate.pairing import NOTHING_RECORDED, Recorded
from proxy.gate.policy import Policy
from proxy.gate.reasons import Outcome, Reason
from proxy.gate.records import read_finding
from proxy.gate.verdict import inspect
from proxy.gate.vocabulary import PayloadCheck, Role, vocabulary_of
from proxy.running.documents import Document, UnreadableDocument
from proxy.state.tool_lists import page_of

# What `check` says of every Chat Completions body it reads: which of the proxy's dialects it is.
CHAT_DOCUMENT = "a Chat Completions body: judged as the proxy gates POST /v1/chat/completions"
CHAT_RECORD = "the record of a Chat Completions request (POST /v1/chat/completions)"

# Exit codes, as `check --help` and docs/check.md say them.
CLEAN, FINDINGS, UNREADABLE = 0, 1, 2

_STRICTER: dict[Outcome, int] = {
    Outcome.FORWARD: 0,
    Outcome.REWRITE: 1,
    Outcome.STRIP: 2,
    Outcome.BLOCK: 3,
}
# The reasons whose recorded finding depends only on the call's arguments and its tool's schema:
# an audit record that kept the arguments is judged again against the pinned schema.
_ARGUMENT_REASONS = frozenset(
    {"arguments_type", "arguments_parse", "unknown_tool", "arguments_schema"}
)

# The reasons a request can have offline only because its calls are in the proxy's ledger.
_IN_THE_LEDGER = frozenset({"orphan", "unknown_reference", "provenance"})


@dataclass(frozen=True)
class Reported:
    """One finding as `check` reports it: where in its document, and its sentence."""

    where: str
    finding: Finding
    message: str


@dataclass(frozen=True)
class Checked:
    """One document's verdict: its outcome, its findings, and sentences about the document."""

    document: Document
    outcome: Outcome
    reported: tuple[Reported, ...] = ()
    notes: tuple[str, ...] = ()


class Checker:
    """Judges documents under one policy, with one set of caches for every document."""

    def __init__(
        self, policy: Policy, recorded: Callable[[Mapping[str, Any]], Recorded] | None = None
    ) -> None:
        self.policy = policy
        # What the ledger recorded for a request (`check --ledger`); None: no ledger to read.
        self.recorded = recorded
        self.caches = GateCaches.for_policy(policy)
        # A call the model emitted (a response's output, a Chat Completions tool call, recorded
        # arguments) is judged as it would be replayed: its status is often absent, and no
        # ledger says where it came from.
        self.emitted = replace(policy, allow_missing_status=True, require_provenance=False)
        self.emitted_caches = GateCaches.for_policy(self.emitted)
        # The kinds of item the target upstream speaks (`--vendor`): which calls carry arguments
        # or input to judge, and how each is paired.
        self.vocabulary = vocabulary_of(policy.vendor)
        # The tools of the MCP `tools/list` results read so far (a later one's win by name),
        # as the proxy keeps a session's list: each `tools/call` after them is judged by them.
        self.mcp_tools: dict[str, Any] = {}

    def check(self, document: Document) -> Checked:
        if document.kind == "response":
            return self.response(document)
        if document.kind == "audit_record":
            return self.audit_record(document)
        if document.kind == "chat_completions":
            return self.chat_completions(document)
        if document.kind == "mcp_message":
            return self.mcp_message(document)
        return self.request(document)

    def mcp_message(self, document: Document) -> Checked:
        """An MCP JSON-RPC message: a `tools/list` result adds its tools to those read; a
        `tools/call` is judged, its `params.arguments` (an object; missing counts as `{}`)
        against the pinned schema or the listed `inputSchema` of its tool, as the proxy's MCP
        door judges it. Other messages pass."""
        sent = document.value
        result = sent.get("result")
        if isinstance(result, dict) and isinstance(result.get("tools"), list):
            for name, tool in page_of(result["tools"]):
                self.mcp_tools[name] = tool.input_schema
            return Checked(document, Outcome.FORWARD)
        params = sent.get("params")
        if sent.get("method") != "tools/call" or not isinstance(params, dict):
            return Checked(document, Outcome.FORWARD)
        arguments = params.get("arguments", {})
        call = {
            "type": items.FUNCTION_CALL,
            "call_id": "mcp",
            "name": params.get("name"),
            "status": "completed",
            # Anything but an object is no object, whatever its type (as the door reads it).
            "arguments": json.dumps(arguments) if isinstance(arguments, dict) else [arguments],
        }
        tools = [
            {"type": "function", "name": name, "parameters": schema}
            for name, schema in self.mcp_tools.items()
        ]
        finding = self.judge_call(call, tools)
        if finding is None:
            return Checked(document, Outcome.FORWARD)
        finding = replace(finding, call_id=None, param="params")
        reported = Reported(_via(document, "params"), finding, message(finding))
        return Checked(document, _strictest([finding]), (reported,))

    def request(self, document: Document) -> Checked:
        body = document.value
        recorded = NOTHING_RECORDED if self.recorded is None else self.recorded(body)
        verdict = inspect(body, self.policy, recorded, self.caches)
        size = len(body["input"]) if isinstance(body.get("input"), list) else 0
        previous = body.get("previous_response_id")
        notes: tuple[str, ...] = ()
        if document.reversed:
            notes = ("an input_items list, read newest first (the API's default order)",)
        reported = []
        for f in verdict.findings:
            if f.index is None:
                where = f.where  # the body's own member: a `messages` envelope
            elif document.kind == "input_items":
                index = size - 1 - f.index if document.reversed else f.index
                where = f"data[{index}]"
            else:
                where = f"input[{f.index}]"
            said = message(f)
            if self.recorded is None and f.reason in _IN_THE_LEDGER:
                said += _offline(f.reason, previous)
            reported.append(Reported(_via(document, where), f, said))
        return Checked(document, verdict.outcome, tuple(reported), notes)

    def response(self, document: Document) -> Checked:
        response = document.value
        tools = document.tools if document.tools is not None else response.get("tools")
        output = response.get("output")
        emitted = output if isinstance(output, list) else []
        # The MCP tools the response's own lists name: an `mcp_call` of a server no list in
        # view names is not judged, as door 2 does not (its list is further up the chain).
        lists = [item for item in emitted if isinstance(item, dict) and items.mcp_tools(item)]
        labels = {item["server_label"] for item in lists}
        calls = [
            (f"output[{i}]", item) for i, item in enumerate(emitted) if self.judged(item, labels)
        ]
        return self.calls(document, calls, tools, lists)

    def judged(self, item: Any, labels: set[str]) -> bool:
        """Whether an emitted item is a call `check` judges: a function call, and in the
        vocabulary of the target's vendor a custom tool call, and an `mcp_call` whose server
        a list in view names."""
        if items.kind(item) == items.FUNCTION_CALL:
            return True
        kind = self.vocabulary.of(item.get("type") if isinstance(item, dict) else None)
        if kind is None:
            return False
        if kind.role == Role.CALL:
            return kind.check == PayloadCheck.GRAMMAR
        return kind.check == PayloadCheck.MCP_SCHEMA and item.get("server_label") in labels

    def chat_completions(self, document: Document) -> Checked:
        """A Chat Completions body judged as the proxy gates `POST /v1/chat/completions`: each
        tool message with the call it answers (`messages[i]`), then each call no tool message
        answers yet, on its own as its replay would be (`messages[i].tool_calls[j]`)."""
        body = document.value
        view = CHAT_COMPLETIONS.view(body)
        # As the live path does once it read the ledger: a call the ledger (given with
        # --ledger) holds is judged by the status it was relayed with, any other as completed.
        recorded = None if self.recorded is None else self.recorded(view.body)
        view.settle(recorded)
        verdict = view.located(
            inspect(view.body, self.policy, recorded or NOTHING_RECORDED, self.caches)
        )
        reported = []
        for f in verdict.findings:
            said = message(f)
            if self.recorded is None and f.reason == Reason.PROVENANCE:
                said += _offline(f.reason, None)
            reported.append(Reported(_via(document, f.where), f, said))
        answered = {m.get("tool_call_id") for m in body["messages"] if isinstance(m, dict)}
        calls = []
        for i, item in enumerate(body["messages"]):
            tool_calls = item.get("tool_calls") if isinstance(item, dict) else None
            for j, tool_call in enumerate(tool_calls if isinstance(tool_calls, list) else []):
                call = _chat_call(tool_call)
                if call is not None and call["call_id"] not in answered:
                    calls.append((f"messages[{i}].tool_calls[{j}]", call))
        judged = self.calls(document, calls, body.get("tools"))
        return Checked(
            document,
            _strictest([*(r.finding for r in reported), *(r.finding for r in judged.reported)]),
            (*reported, *judged.reported),
            (CHAT_DOCUMENT,),
        )

    def calls(
        self,
        document: Document,
        calls: Sequence[tuple[str, Any]],
        tools: Any,
        context: Sequence[Any] = (),
    ) -> Checked:
        """Each call judged on its own, as its replay would be: against `tools` (and the MCP
        lists of `context`), the pinned schemas first."""
        reported = []
        for where, call in calls:
            finding = self.judge_call(call, tools, context)
            if finding is not None:
                reported.append(Reported(_via(document, where), finding, message(finding)))
        return Checked(document, _strictest([r.finding for r in reported]), tuple(reported))

    def judge_call(
        self, call: dict[str, Any], tools: Any, context: Sequence[Any] = ()
    ) -> Finding | None:
        """The finding its replay would have, or None; an output answering it is made up (an
        `mcp_call`, run by the server, is answered inside itself), after the items of
        `context` (the MCP lists it is judged by)."""
        call_id = call.get("call_id")
        kind = self.vocabulary.of(call.get("type"))
        replayed: list[Any] = [*context, call]
        if kind is None or kind.role == Role.CALL:
            if not isinstance(call_id, str):
                # Paired under a made-up id: the call is judged, not the missing id.
                call = {**call, "call_id": "-"}
            partner = "function_call_output" if kind is None else kind.partner
            replayed = [*context, call, {"type": partner, "call_id": call["call_id"], "output": ""}]
        body = {"tools": tools if isinstance(tools, list) else [], "input": replayed}
        verdict = inspect(body, self.emitted, caches=self.emitted_caches)
        found = [f for f in verdict.findings if f.index == len(replayed) - 1]
        if not found:
            return None
        return replace(
            found[0],
            index=0,
            paired_index=None,
            call_id=call_id if isinstance(call_id, str) else None,
            action=self.policy.action_for(found[0].reason),
        )

    def audit_record(self, document: Document) -> Checked:
        """What a record holds: its findings, each judged again when the record kept the call's
        arguments and the config pins its tool's schema; else reported as recorded."""
        record = document.value
        emitted = record.get("event") == "emitted_call_rejected"
        reported: list[Reported] = []
        notes: list[str] = [CHAT_RECORD] if label_of(record.get("path")) == "chat" else []
        for recorded in record["findings"]:
            finding = read_finding(recorded, self.policy.action_for)
            if finding is None:
                notes.append(f"a finding that is not one the proxy writes: {_shown(recorded)}")
                continue
            # A recorded `param` names the place in the body's own dialect (`messages[3]`).
            where = (
                finding.where
                if finding.index is None or finding.param is not None
                else f"{'output' if emitted else 'input'}[{finding.index}]"
            )
            if (
                finding.reason in _ARGUMENT_REASONS
                and "arguments" in recorded
                and finding.name in self.policy.pinned
            ):
                call = {
                    "type": "function_call",
                    "call_id": finding.call_id,
                    "name": finding.name,
                    "status": "completed",
                    "arguments": recorded["arguments"],
                }
                again = self.judge_call(call, [])
                if again is None:
                    notes.append(
                        f"{where}: recorded {finding.reason}, and its arguments pass the pinned "
                        f"schema of {finding.name} now"
                    )
                    continue
                finding = replace(
                    again,
                    index=finding.index,
                    paired_index=finding.paired_index,
                    call_id=finding.call_id,
                )
            reported.append(Reported(_via(document, where), finding, message(finding)))
        return Checked(
            document, _strictest([r.finding for r in reported]), tuple(reported), tuple(notes)
        )


def _offline(reason: str, previous: Any) -> str:
    """What check cannot see without the ledger, and how to let it."""
    hint = "which check cannot see: pass --ledger redis://... (and --tenant)"
    if reason == "provenance":
        return f"; what the proxy relayed is only in the ledger, {hint}"
    if reason == "orphan" and not isinstance(previous, str):
        return ""
    where = f" (previous_response_id {previous})" if isinstance(previous, str) else ""
    return f"; the paired item may be only in the ledger{where}, {hint}"


def _via(document: Document, where: str) -> str:
    return f"{document.via}.{where}" if document.via else where


def _strictest(findings: Iterable[Finding]) -> Outcome:
    outcome = Outcome.FORWARD
    for f in findings:
        action = Outcome.FORWARD if f.action == "log" else Outcome(f.action)
        if _STRICTER[action] > _STRICTER[outcome]:
            outcome = action
    return outcome


def _chat_call(tool_call: Any) -> dict[str, Any] | None:
    """A Chat Completions tool call as the function_call item it stands for."""
    if not isinstance(tool_call, dict) or tool_call.get("type", "function") != "function":
        return None
    function = tool_call.get("function")
    if not isinstance(function, dict):
        return None
    return {
        "type": "function_call",
        "call_id": tool_call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments"),
    }


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:200]


# Reports


@dataclass
class CheckTally:
    """What the summary counts: documents, findings by reason and tool, unreadable input."""

    documents: int = 0
    dirty: int = 0
    unreadable: int = 0
    files: set[str] = field(default_factory=set)
    by_reason_tool: Counter[tuple[str, str]] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)

    def add(self, checked: Checked) -> None:
        self.documents += 1
        self.files.add(checked.document.file)
        self.dirty += bool(checked.reported)
        for r in checked.reported:
            self.by_reason_tool[(r.finding.reason, r.finding.name or "-")] += 1
            self.actions[r.finding.action] += 1

    @property
    def findings(self) -> int:
        return sum(self.by_reason_tool.values())

    def exit_code(self) -> int:
        if self.unreadable:
            return UNREADABLE
        return FINDINGS if self.findings else CLEAN


def iter_lines(checked: Checked) -> Iterator[str]:
    """A document's notes and one line per finding: where, the call, the reason, the action,
    and the finding's sentence."""
    prefix = checked.document.where
    for note in checked.notes:
        yield f"{prefix}: {note}"
    for r in checked.reported:
        f = r.finding
        yield (
            f"{prefix}: {r.where} {f.call_id or '-'} {f.name or '-'}: {f.reason} [{f.action}]: "
            f"{r.message}"
        )


def dialect(document: Document) -> str | None:
    """The dialect a document is in: `chat` for a Chat Completions body, an audit record's as
    its `path` says, `responses` for every other document."""
    if document.kind == "chat_completions":
        return "chat"
    if document.kind == "audit_record":
        return label_of(document.value.get("path"))
    return "responses"


def iter_json(checked: Checked) -> Iterator[str]:
    """One JSON line per finding: its file, line and place, the document's kind and dialect,
    the finding."""
    document = checked.document
    for r in checked.reported:
        finding = r.finding.as_dict() | {"action": r.finding.action, "message": r.message}
        yield json.dumps(
            {
                "file": document.file,
                "line": document.line,
                "element": document.element,
                "kind": document.kind,
                "dialect": dialect(document),
                "where": r.where,
                "outcome": checked.outcome,
                "finding": finding,
            },
            ensure_ascii=False,
        )


def iter_summary(tally: CheckTally) -> Iterator[str]:
    """The findings counted by reason and tool, then the totals."""
    if tally.by_reason_tool:
        rows = sorted(tally.by_reason_tool.items(), key=lambda row: (-row[1], row[0]))
        reason_width = max(len("reason"), *(len(r) for (r, _), _ in rows))
        tool_width = max(len("tool"), *(len(t) for (_, t), _ in rows))
        yield ""
        yield f"{'reason':<{reason_width}}  {'tool':<{tool_width}}  findings"
        for (reason, tool), count in rows:
            yield f"{reason:<{reason_width}}  {tool:<{tool_width}}  {count:>8}"
    actions = ", ".join(f"{n} {a}" for a, n in sorted(tally.actions.items()))
    files = len(tally.files)
    line = (
        f"{tally.documents} document(s) in {files} file(s): {tally.findings} finding(s)"
        f"{' (' + actions + ')' if actions else ''} in {tally.dirty} document(s)"
    )
    if tally.unreadable:
        line += f"; {tally.unreadable} unreadable (named on stderr)"
    yield line


def report_unreadable(unreadable: UnreadableDocument) -> str:
    return f"replay-proxy: {unreadable}"
