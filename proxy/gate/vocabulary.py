"""The item vocabulary as data: each kind of input item, and which kinds each vendor speaks.

A kind is a call, an output, or neither. A call and its output are paired by a key each holds
in one field (`call_id` for most; an MCP approval request is named by its `id`, its response by
`approval_request_id`; a local shell output carries its call's `call_id` in `id`). A kind that
carries arguments or input names the field and how it is checked. `status` says whether a
call carries a status (a `custom_tool_call` has none).

`VOCABULARIES` says which kinds are native to an upstream of each `vendor`; an upstream whose
vendor has no entry keeps the gate's original vocabulary, where every unslugged kind passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    CALL = "call"
    OUTPUT = "output"
    NEITHER = "neither"


class PayloadCheck(StrEnum):
    """How the arguments or input of a kind are checked."""

    # A JSON string validated against the `parameters` of its function tool.
    JSON_SCHEMA = "json_schema"
    # A JSON string validated against the `input_schema` an `mcp_list_tools` item lists.
    MCP_SCHEMA = "mcp_schema"
    # A free string checked against its custom tool's `format` (text, or a grammar).
    GRAMMAR = "grammar"
    # Structured by the API itself (a shell action, a patch operation): not a tool's schema.
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of input item, as the gate reads it."""

    type: str
    role: Role = Role.NEITHER
    # The field whose string pairs a call with its output.
    pairs_by: str | None = None
    # For a call, the kind of its output; for an output, the kind of its call.
    partner: str | None = None
    # The field holding the arguments or input, and how they are checked.
    payload: str | None = None
    check: PayloadCheck = PayloadCheck.NONE
    # Whether a call of this kind carries a `status` (`completed` when it may be replayed).
    status: bool = False


def _pair(
    call: str,
    output: str,
    *,
    call_key: str = "call_id",
    output_key: str = "call_id",
    payload: str | None = None,
    check: PayloadCheck = PayloadCheck.NONE,
    status: bool = True,
) -> tuple[Kind, Kind]:
    return (
        Kind(call, Role.CALL, call_key, output, payload, check, status),
        Kind(output, Role.OUTPUT, output_key, call),
    )


# Every kind of the OpenAI Responses API's input items (`ResponseInputItemParam` of the openai
# SDK; a test fails when the SDK has one this table lacks).
OPENAI_KINDS: tuple[Kind, ...] = (
    Kind("message"),
    Kind("item_reference"),
    *_pair(
        "function_call", "function_call_output", payload="arguments", check=PayloadCheck.JSON_SCHEMA
    ),
    *_pair(
        "custom_tool_call",
        "custom_tool_call_output",
        payload="input",
        check=PayloadCheck.GRAMMAR,
        status=False,
    ),
    *_pair("computer_call", "computer_call_output"),
    *_pair("local_shell_call", "local_shell_call_output", output_key="id"),
    *_pair("shell_call", "shell_call_output"),
    *_pair("apply_patch_call", "apply_patch_call_output"),
    *_pair("tool_search_call", "tool_search_output"),
    *_pair("program", "program_output", status=False),
    *_pair(
        "mcp_approval_request",
        "mcp_approval_response",
        call_key="id",
        output_key="approval_request_id",
        payload="arguments",
        check=PayloadCheck.MCP_SCHEMA,
        status=False,
    ),
    # Run by the server, its output inside it: nothing answers it, but its arguments are checked.
    Kind("mcp_call", payload="arguments", check=PayloadCheck.MCP_SCHEMA, status=True),
    Kind("mcp_list_tools"),
    Kind("file_search_call"),
    Kind("web_search_call"),
    Kind("image_generation_call"),
    Kind("code_interpreter_call"),
    Kind("additional_tools"),
    Kind("configuration_update"),
    Kind("reasoning"),
    Kind("compaction"),
    Kind("compaction_trigger"),
)

# The kinds the gate knew before it had a vocabulary per vendor: an upstream without a vendor
# (or of a vendor without an entry) has these, and passes every other unslugged kind.
CORE_KINDS: tuple[Kind, ...] = tuple(
    k
    for k in OPENAI_KINDS
    if k.type in ("message", "item_reference", "function_call", "function_call_output")
)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The kinds native to one upstream. `closed`: a kind outside them is foreign to it."""

    kinds: Mapping[str, Kind]
    closed: bool
    # The kinds of `kinds` the gate pairs as outputs, and those that carry their own result
    # and a payload it checks (an `mcp_call`): looked up once per item, so kept apart.
    outputs: Mapping[str, Kind] = field(init=False)
    ran: Mapping[str, Kind] = field(init=False)

    def __post_init__(self) -> None:
        outputs = {t: k for t, k in self.kinds.items() if k.role == Role.OUTPUT}
        ran = {
            t: k
            for t, k in self.kinds.items()
            if k.role == Role.NEITHER and k.check != PayloadCheck.NONE
        }
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "ran", ran)

    def native(self, item_type: str) -> bool:
        return not self.closed or item_type in self.kinds

    def of(self, item_type: object) -> Kind | None:
        return self.kinds.get(item_type) if isinstance(item_type, str) else None

    def output_of(self, item_kind: str | None) -> Kind | None:
        """The kind of an output the gate pairs with its call; None for any other item."""
        return self.outputs.get(item_kind) if item_kind is not None else None


def _vocabulary(kinds: tuple[Kind, ...], *, closed: bool) -> Vocabulary:
    return Vocabulary({k.type: k for k in kinds}, closed)


CORE = _vocabulary(CORE_KINDS, closed=False)

VOCABULARIES: Mapping[str, Vocabulary] = {"openai": _vocabulary(OPENAI_KINDS, closed=True)}


def vocabulary_of(vendor: str | None) -> Vocabulary:
    """The vocabulary of an upstream of `vendor`: its own when the table has one, else CORE."""
    return VOCABULARIES.get(vendor, CORE) if vendor is not None else CORE
