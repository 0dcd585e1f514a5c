"""A finding as a value, and how it is said: one table gives each reason its sentence (a
rewrite's failure record, `check`) and its headline (a rejection's message)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.gate import items, strictjson
from proxy.gate.phrases import CHAT_BODY, json_type, violations
from proxy.gate.reasons import Action, Reason
from proxy.gate.schemas import Violation

# A Chat Completions body's conversation: on a Responses path, an envelope of its own.
MESSAGES = "messages"


@dataclass(frozen=True, slots=True)
class Failed:
    """What one check found wrong with a paired call: the reason, and where there is more to
    say, what failed (the violations of the arguments' schema or of the spec's item schema,
    with those counted past the cap), the properties that passed, the failing item's type."""

    reason: Reason
    fail: tuple[Violation, ...] = ()
    passed: tuple[str, ...] = ()
    fail_omitted: int = 0
    item_type: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One rejected replay: the output at `index` and why its paired item fails the gate; or,
    with `index` None, what the body holds at its member `param` (a `messages` envelope)."""

    index: int | None
    reason: Reason
    action: Action
    call_id: str | None = None
    paired_index: int | None = None
    name: str | None = None
    fail: tuple[Violation, ...] = ()
    arguments: Any = None
    # The `id` an unknown `item_reference` names.
    reference: str | None = None
    # The top-level properties of the arguments that passed their schema.
    passed: tuple[str, ...] = ()
    # The `type` of the item the finding is about, where the output's paired call does not say
    # it: a foreign item's; for `not_portable`, which of the pair breaks the spec's schema.
    item_type: str | None = None
    # What the paired item shows of the reason, in words (`phrases.detail_of`): "status is
    # missing", the item's type.
    detail: str | None = None
    # Violations found beyond those `fail` lists (`Bounds.max_violations`), counted.
    fail_omitted: int = 0
    # Where the finding is when it is no item of input: the body's member (`messages`).
    param: str | None = None

    @property
    def where(self) -> str:
        """The finding's place in the body, as an error's `param` names it."""
        return self.param if self.param is not None else f"input[{self.index}]"

    def as_dict(self, *, include_arguments: bool = False) -> dict[str, Any]:
        """The finding as an answer and an audit record list it (`records.read_finding` reads
        it back)."""
        found: dict[str, Any] = {
            "index": self.index,
            "call_id": self.call_id,
            "paired_index": self.paired_index,
            "name": self.name,
            "reason": self.reason,
        }
        if self.param is not None:
            found["param"] = self.param
        if self.reason == Reason.ARGUMENTS_SCHEMA:
            found["pass"] = list(self.passed)
            found["fail"] = [v.as_dict() for v in self.fail]
        if self.reason == Reason.INPUT_GRAMMAR:
            found["fail"] = [v.as_dict() for v in self.fail]
        if self.reason == Reason.UNKNOWN_REFERENCE:
            found["id"] = self.reference
        if self.reason == Reason.NOT_PORTABLE:
            found["type"] = self.item_type
            found["fail"] = [v.as_dict() for v in self.fail]
        if self.fail_omitted:
            found["fail_omitted"] = self.fail_omitted
        if self.reason == Reason.FOREIGN_ITEM:
            found["type"] = self.item_type
        if include_arguments:
            found["arguments"] = self.arguments
        found["message"] = message(self)  # the reason in one sentence, as `check` prints it
        return found

    def describe(self) -> str:
        """The finding as a rejection's message opens: its place, what failed, the reason."""
        where = self.where
        if self.call_id is not None:
            where += f" (call_id {self.call_id})"
        headline = _WORDS[self.reason].headline
        if headline is not None:
            return f"{where}: {headline(self)}: {self.reason}"
        subject = f"paired {_call(self)}"
        if self.item_type in _RAN:
            subject = f"the {self.item_type}"
        if self.reason == Reason.NOT_PORTABLE and self.item_type == items.FUNCTION_CALL_OUTPUT:
            subject = "the function_call_output"
        detail = str(self.reason)
        if self.fail:
            detail += " at " + ", ".join(
                f"{v.path or '/'} ({v.reason}{': ' + v.message if v.message else ''})"
                for v in self.fail
            )
        if self.fail_omitted:
            detail += f", and {self.fail_omitted} more"
        return f"{where}: {subject} failed the replay gate: {detail}"


def message(finding: Finding) -> str:
    """The finding's sentence: the reason in words, with what this item shows of it (the
    status found, the duplicate key and where, every schema violation)."""
    return _WORDS[finding.reason].sentence(finding)


@dataclass(frozen=True, slots=True)
class _Words:
    """How one reason is said: its `sentence`, and the `headline` a rejection's message gives
    it after the place (None: the paired call "failed the replay gate", with its violations)."""

    sentence: Callable[[Finding], str]
    headline: Callable[[Finding], str] | None = None


def _call(f: Finding) -> str:
    """The kind of call the finding's output answers: a function_call, unless the finding
    names another (`item_type`, outside `not_portable` and `foreign_item`)."""
    if f.reason in (Reason.NOT_PORTABLE, Reason.FOREIGN_ITEM) or f.item_type is None:
        return items.FUNCTION_CALL
    return f.item_type


def _orphan(f: Finding) -> str:
    if _in_messages(f):
        if f.call_id is None:
            return "this tool message has no tool_call_id (or one that is not a string)"
        return (
            f"no tool_calls entry with id {f.call_id} in an earlier assistant message: this "
            "tool message answers no call"
        )
    if f.call_id is None:
        return (
            "this output has no call_id (or one that is not a string): it answers no call, so "
            "no call can be found for it"
        )
    return (
        f"no {_call(f)} with call_id {f.call_id} precedes this output: not inline, not "
        "behind an item_reference, not in the previous_response_id chain the proxy recorded"
    )


def _orphan_headline(f: Finding) -> str:
    if _in_messages(f):
        return "no earlier tool call has this tool_call_id"
    if f.call_id is None:
        return "the output has no string call_id"
    return f"no {_call(f)} with this call_id precedes it"


def _duplicate(f: Finding) -> str:
    if _in_messages(f):
        return (
            f"more than one tool_calls entry, or more than one tool message, has id {f.call_id}: "
            "which one was answered is ambiguous"
        )
    return (
        f"more than one {_call(f)}, or more than one output, has call_id {f.call_id}: "
        "which one was answered is ambiguous"
    )


def _status(f: Finding) -> str:
    if _in_messages(f):
        # A Chat message carries no status: the proxy's record of its completion says it.
        return (
            "the proxy relayed this tool call in a completion that was cut short "
            "(finish_reason length or content_filter, or a stream that never ended): a "
            "replayed call must be complete"
        )
    said = f.detail or "status is not completed"
    return f"{said}: a replayed {_call(f)} must be completed"


def _namespaced(f: Finding) -> str:
    shown = f" ({f.detail})" if f.detail else ""
    return f"the paired item is a vendor extension, not a portable function_call{shown}"


def _not_function_call(f: Finding) -> str:
    shown = f" ({f.detail})" if f.detail else ""
    return f"the paired item is not a {_call(f)}{shown}"


def _arguments_type(f: Finding) -> str:
    if _in_mcp(f):
        # Shown to the gate as one element of an array: what the call sent is that element.
        sent = f.arguments[0] if isinstance(f.arguments, list) and f.arguments else None
        kind = json_type(sent)
        return f"params.arguments must be an object{f' but {kind}' if kind else ''}"
    if f.detail:
        return f"{f.detail}: a function_call carries its arguments as a string of JSON"
    kind = json_type(f.arguments)
    shown = f" but {kind}" if kind is not None else ""
    return f"arguments must be a string of JSON{shown}"


def _arguments_parse(f: Finding) -> str:
    said = "arguments are not one strict JSON value"
    if not isinstance(f.arguments, str):
        return said
    try:
        strictjson.loads(f.arguments, exact=True)
    except strictjson.StrictJSONError as exc:
        return f"{said}: {exc}"
    return said


# The calls a server ran, their results inside them: a finding is about the call itself.
_RAN = ("mcp_call",)
_MCP = ("mcp_call", "mcp_approval_request")


def _unknown_tool(f: Finding) -> str:
    if _in_mcp(f):
        return (
            f"the session's tools/list names no tool {f.name or '(unnamed)'} (or the server said "
            "its list changed since): list the tools again, or pin one under tools: as "
            "<server>/<name>"
        )
    if f.item_type in _MCP:
        return (
            f"no mcp_list_tools item of the context lists tool {f.name or '(unnamed)'} of its "
            "server_label: pin one under tools: as <server_label>/<name>"
        )
    return (
        f"no schema for tool {f.name or '(unnamed)'}: pin one under tools: or send it in the "
        "request's tools"
    )


def _arguments_schema(f: Finding) -> str:
    return violations(f.fail, f.fail_omitted) or "the arguments failed schema"


def _input_grammar(f: Finding) -> str:
    said = "the input breaks its custom tool's format"
    shown = "; ".join(v.message or v.reason for v in f.fail)
    return f"{said}: {shown}" if shown else said


def _envelope(f: Finding) -> str:
    if f.param == MESSAGES:
        return CHAT_BODY
    if _in_messages(f):
        return (
            "an Open Responses item (function_call, function_call_output, item_reference) inside "
            "messages: Chat Completions carries assistant tool_calls and role: tool messages "
            "instead"
        )
    return (
        "a Chat Completions message (role: tool, tool_calls or tool_call_id) inside input: "
        "Open Responses carries function_call and function_call_output items instead"
    )


def _envelope_headline(f: Finding) -> str:
    if f.param == MESSAGES:
        return "a Chat Completions body on a Responses path"
    if _in_messages(f):
        return "an Open Responses item inside messages"
    return "a Chat Completions message inside input"


def _in_mcp(f: Finding) -> bool:
    """A finding about an MCP `tools/call` (`params`, or `[i].params` in a batch)."""
    return f.param is not None and (f.param == "params" or f.param.endswith("].params"))


def _in_messages(f: Finding) -> bool:
    """A finding placed in a Chat Completions body's `messages` (`messages[4]`)."""
    return f.param is not None and f.param.startswith(MESSAGES + "[")


def _ambiguous(f: Finding) -> str:
    return (
        "an item without a type that the spec's defaults read as more than one kind: give it a type"
    )


def _unknown_reference(f: Finding) -> str:
    named = f" {f.reference}" if f.reference is not None else ""
    return f"item_reference{named} names no item the proxy relayed"


def _provenance(f: Finding) -> str:
    return (
        "no upstream response the proxy relayed to this client emitted this call (its call_id, "
        "name and arguments)"
    )


def _foreign_item(f: Finding) -> str:
    if f.item_type and ":" not in f.item_type:
        return (
            f"{f.item_type} is not a kind of item the upstream's vendor speaks: it would be "
            "refused or misread there"
        )
    shown = f" ({f.item_type})" if f.item_type else ""
    return (
        f"the item's type carries another vendor's slug than the upstream's{shown}: it is not "
        "portable"
    )


def _not_portable(f: Finding) -> str:
    said = "the call or its output breaks the spec's item schema (call_id, name, field types)"
    if not f.fail:
        return said
    item = f.item_type or "call"
    return (
        f"the {item} breaks the spec's item schema (a server may refuse it): "
        f"{violations(f.fail, f.fail_omitted)}"
    )


def _tool_not_allowed(f: Finding) -> str:
    return (
        f"the model called {f.name or '(unnamed)'}, outside the tools the request's tool_choice "
        "allowed (allowed_tools)"
    )


def _foreign_headline(f: Finding) -> str:
    if f.item_type and ":" not in f.item_type:
        return f"{f.item_type} is not a kind of item this upstream speaks"
    return f"{f.item_type} is another vendor's item, not portable to this upstream"


# Every reason, said (a test checks that none is missing).
_WORDS: dict[Reason, _Words] = {
    Reason.ORPHAN: _Words(_orphan, _orphan_headline),
    Reason.DUPLICATE_CALL_ID: _Words(_duplicate),
    Reason.PROVENANCE: _Words(_provenance),
    Reason.NAMESPACED: _Words(_namespaced),
    Reason.NOT_FUNCTION_CALL: _Words(_not_function_call),
    Reason.NOT_PORTABLE: _Words(_not_portable),
    Reason.STATUS: _Words(_status),
    Reason.ARGUMENTS_TYPE: _Words(_arguments_type),
    Reason.ARGUMENTS_PARSE: _Words(_arguments_parse),
    Reason.UNKNOWN_TOOL: _Words(_unknown_tool),
    Reason.ARGUMENTS_SCHEMA: _Words(_arguments_schema),
    Reason.INPUT_GRAMMAR: _Words(_input_grammar),
    Reason.ENVELOPE: _Words(_envelope, _envelope_headline),
    Reason.AMBIGUOUS_ITEM: _Words(
        _ambiguous, lambda f: "an item without a type reads as more than one kind"
    ),
    Reason.UNKNOWN_REFERENCE: _Words(_unknown_reference, _unknown_reference),
    Reason.TOOL_NOT_ALLOWED: _Words(_tool_not_allowed),
    Reason.FOREIGN_ITEM: _Words(
        _foreign_item,
        _foreign_headline,
    ),
}
