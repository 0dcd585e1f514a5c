"""Door 2: the model's own calls, checked against the schema they would be replayed under.

A host checks the model's call against the tool's schema before it runs it. The proxy sees every
`function_call` an upstream emits. It judges each with the gate's own checks (`arguments_type`,
`arguments_parse`, `unknown_tool`, `arguments_schema`), compiled schemas and verdict cache. An
upstream whose vocabulary has `mcp_call` (vendor openai) has its `mcp_call`s judged the same way,
against the `input_schema` an `mcp_list_tools` item of the response or of the request lists
(a call to a server no list in view names is not judged: its list is further up the chain).
When the request's `tool_choice` is `allowed_tools`, a call outside them is `tool_not_allowed`.
A call that fails is a `Finding` in the shape of a rejected replay, its `index` the call's place
in the response's `output`. Nothing is changed: the answer was relayed before the check.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError

from proxy.gate import items
from proxy.gate.arguments import judged_arguments, schemas_key
from proxy.gate.budget import Allowance
from proxy.gate.caches import GateCaches
from proxy.gate.findings import Failed, Finding
from proxy.gate.policy import Policy
from proxy.gate.reasons import Reason
from proxy.gate.schemas import MAX_VIOLATIONS, Compiled
from proxy.gate.vocabulary import vocabulary_of

OK = "ok"


@dataclass(frozen=True, slots=True)
class Emitted:
    """One function_call of a response's `output`: its place, its tool, and the verdict
    (`ok` or the reason it fails, a metric's label); `finding` is set when it fails."""

    index: int
    name: str | None
    verdict: str
    # Whether a schema is known for the call's tool (pinned, or in the request's tools).
    known_tool: bool
    finding: Finding | None = None


MCP_CALL = "mcp_call"
_JUDGED = (items.FUNCTION_CALL, MCP_CALL)


def emitted_calls(output: Any) -> list[tuple[int, Mapping[str, Any]]]:
    """The function_call and mcp_call items of a response's `output`, each with its index."""
    if not isinstance(output, list):
        return []
    return [
        (index, item)
        for index, item in enumerate(output)
        if isinstance(item, dict) and item.get("type") in _JUDGED
    ]


def listed_tools(*sources: Any) -> dict[str, list[Any]]:
    """The `input_schema` of each MCP tool (`<server_label>/<name>`) the `mcp_list_tools` items
    of `sources` (lists of items: a response's output, a request's input) list."""
    found: dict[str, list[Any]] = {}
    for source in sources:
        for item in source if isinstance(source, (list, tuple)) else ():
            if isinstance(item, dict):
                for name, schema in items.mcp_tools(item):
                    found.setdefault(name, []).append({} if schema is None else schema)
    return found


class ToolSchemas:
    """The schemas each tool name is judged by, for one set of a request's function tools
    under one policy: the pinned schema, else every `parameters` of that name in the tools.
    Each name's are looked up once (the same compiled objects the gate finds in `caches`)."""

    def __init__(
        self, tools: Sequence[tuple[str, Any]], policy: Policy, caches: GateCaches
    ) -> None:
        self.policy = policy
        self.caches = caches
        self.offered: dict[str, list[Any]] = {}
        for name, parameters in tools:
            self.offered.setdefault(name, []).append({} if parameters is None else parameters)
        self._found: dict[str, list[Compiled | SchemaError]] = {}

    def pending(self, calls: Sequence[tuple[int, Mapping[str, Any]]]) -> list[Any]:
        """The request schemas of these calls' tools not compiled yet: compiled off the event
        loop first, as the gate's are (see `pending_schemas`)."""
        limits = self.policy.schema_limits
        named = (items.tool_name(call) for _, call in calls)
        called = {n for n in named if n is not None} - self._found.keys()
        return [
            schema
            for name, schemas in self.offered.items()
            if name in called and self.policy.pin_for(name) is None
            for schema in schemas
            if self.caches.schemas.pending(schema, limits)
        ]

    def listed(self, name: str, listed: Mapping[str, list[Any]]) -> list[Compiled | SchemaError]:
        """An MCP tool's schemas: the pinned one (`<server_label>/<name>`, else the bare name),
        else those its lists give."""
        pinned = self.policy.pin_for(name)
        return [pinned] if pinned is not None else [self._compile(s) for s in listed[name]]

    def of(self, name: str | None) -> list[Compiled | SchemaError]:
        if name is None:
            return []
        found = self._found.get(name)
        if found is None:
            pinned = self.policy.pin_for(name)
            found = (
                [pinned]
                if pinned is not None
                else [self._compile(s) for s in self.offered.get(name, ())]
            )
            self._found[name] = found
        return found

    def _compile(self, schema: Any) -> Compiled | SchemaError:
        try:
            return self.caches.schemas.compile(schema, self.policy.schema_limits)
        except SchemaError as exc:
            return exc


def iter_emitted(
    calls: Sequence[tuple[int, Mapping[str, Any]]],
    schemas: ToolSchemas,
    max_violations: int = MAX_VIOLATIONS,
    listed: Mapping[str, list[Any]] | None = None,
    allowed: frozenset[str] | None = None,
) -> Iterator[Emitted]:
    """The verdict on each emitted call; never raises on any JSON value.

    `schemas` are those of the function tools of the request the response answers; a schema
    pinned in the policy wins over them, as it does when the call is replayed. Every call of
    one response shares one validation allowance, as the calls of one request do; a finding
    lists at most `max_violations` violations (`limits.max_violations`), the others counted.
    `listed` gives the MCP tools of the lists in view (`listed_tools`); `allowed`, the tools the
    request's `tool_choice` allows (`items.allowed_tools`), a call outside them failing first.
    """
    allowance = Allowance(schemas.policy.validation_timeout_s)
    speaks_mcp = vocabulary_of(schemas.policy.vendor).of(MCP_CALL) is not None
    listed = listed or {}
    for index, call in calls:
        named = call.get("name")
        name = named if isinstance(named, str) else None
        is_mcp = call.get("type") == MCP_CALL
        if is_mcp and not speaks_mcp:
            continue
        failed: Failed | None = None
        if allowed is not None and not items.permitted(call, allowed):
            failed = Failed(Reason.TOOL_NOT_ALLOWED)
        if is_mcp:
            mcp_name = items.mcp_tool_name(call)
            label = f"{call.get('server_label')}/"
            if failed is None and not any(n.startswith(label) for n in listed):
                continue
            found = schemas.listed(mcp_name, listed) if mcp_name in listed and mcp_name else []
        else:
            found = schemas.of(items.tool_name(call))
        if failed is None:
            arguments = call.get("arguments")
            failed = _judged(arguments, found, schemas.caches, allowance, max_violations)
        if failed is None:
            yield Emitted(index, name, OK, bool(found))
            continue
        call_id = call.get("call_id")
        finding = Finding(
            index,
            failed.reason,
            "log",  # door 2 only watches: the answer went to the client as it came
            call_id if isinstance(call_id, str) else None,
            None,
            name,
            failed.fail,
            call.get("arguments"),
            passed=failed.passed,
            item_type=MCP_CALL if is_mcp else None,
            fail_omitted=failed.fail_omitted,
        )
        yield Emitted(index, name, failed.reason, bool(found), finding)


def _judged(
    arguments: Any,
    schemas: list[Compiled | SchemaError],
    caches: GateCaches,
    allowance: Allowance,
    max_violations: int,
) -> Failed | None:
    """What the gate's checks of arguments find, or None: shared with it through the verdict
    cache (a replay of this call later finds it decided)."""
    if not isinstance(arguments, str):
        return Failed(Reason.ARGUMENTS_TYPE)
    return judged_arguments(
        arguments, schemas, schemas_key(schemas), caches, allowance, max_violations
    )
