"""The gate's words: why an item fails (`Reason`), what a finding does (`Action`), and what
became of a request (`Outcome`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class Reason(StrEnum):
    """Why an item fails the gate. A member is its own string: audit records, metric labels,
    the config's `gate.actions` keys and `check` all write and compare the value."""

    # An output's reasons, checked in this order; the first that applies wins.
    ORPHAN = "orphan"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    PROVENANCE = "provenance"
    NAMESPACED = "namespaced"
    NOT_FUNCTION_CALL = "not_function_call"
    NOT_PORTABLE = "not_portable"
    STATUS = "status"
    ARGUMENTS_TYPE = "arguments_type"
    ARGUMENTS_PARSE = "arguments_parse"
    UNKNOWN_TOOL = "unknown_tool"
    ARGUMENTS_SCHEMA = "arguments_schema"
    # A custom tool's call: its `input` breaks the tool's grammar (where function calls stand
    # at `arguments_schema`).
    INPUT_GRAMMAR = "input_grammar"
    # Item-level reasons: about one item of `input` itself, found beside any output's reason.
    ENVELOPE = "envelope"
    AMBIGUOUS_ITEM = "ambiguous_item"
    UNKNOWN_REFERENCE = "unknown_reference"
    # An item whose `type` carries another vendor's slug than the target upstream's `vendor`.
    FOREIGN_ITEM = "foreign_item"
    # Door 2 only: a call the model emitted outside the request's `allowed_tools`.
    TOOL_NOT_ALLOWED = "tool_not_allowed"


Action = Literal["block", "strip", "rewrite", "log"]


class Outcome(StrEnum):
    """What became of a request. A member is its own string: the `outcome` label of
    `replay_proxy_requests_total`, the access line's `outcome`, `check`'s summary and the audit
    report write and compare the value."""

    # The gate's verdicts (`Verdict.outcome`); a request it does not gate is forwarded too.
    FORWARD = "forward"
    STRIP = "strip"
    REWRITE = "rewrite"
    BLOCK = "block"
    # Answered by the proxy, counted: a body it could not read, a target that is none, a path
    # under `/-/` that is no admin endpoint, a client without a listed key, the ledger out of
    # reach (503), no answer from the upstream.
    INVALID = "invalid"
    INVALID_TARGET = "invalid_target"
    NOT_FOUND = "not_found"
    UNAUTHORIZED = "unauthorized"
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    UPSTREAM_ERROR = "upstream_error"
    # The access line's own: an error answer (its `code` says which), an admin endpoint, the
    # client hung up first, the upstream failed after the answer began.
    ERROR = "error"
    ADMIN = "admin"
    CLIENT_GONE = "client_gone"
    UPSTREAM_CUT = "upstream_cut"


ACTIONS: tuple[Action, ...] = ("block", "strip", "rewrite", "log")

ENVELOPE = Reason.ENVELOPE
AMBIGUOUS_ITEM = Reason.AMBIGUOUS_ITEM
UNKNOWN_REFERENCE = Reason.UNKNOWN_REFERENCE
FOREIGN_ITEM = Reason.FOREIGN_ITEM

ITEM_REASONS = (ENVELOPE, AMBIGUOUS_ITEM, UNKNOWN_REFERENCE, FOREIGN_ITEM)

# The reasons of door 2 alone, which only watches: no `gate.actions` key, no replay finds them.
EMITTED_REASONS = (Reason.TOOL_NOT_ALLOWED,)

# Checked in this order; the first that applies wins.
REASONS = tuple(r for r in Reason if r not in ITEM_REASONS and r not in EMITTED_REASONS)

# The reasons of the gate's findings, each a `gate.actions` key.
ALL_REASONS = (*REASONS, *ITEM_REASONS)

# Reasons whose output has no call to tell the model about (or whose item is not an output),
# and `not_portable`, whose pair a rewritten output would not make portable (the call stays as
# it was): `rewrite` cannot be their action. Under `action: rewrite` they are blocked.
NOT_REWRITTEN = (
    Reason.ORPHAN,
    Reason.DUPLICATE_CALL_ID,
    Reason.NOT_PORTABLE,
    *ITEM_REASONS,
)
