"""Door 2 at the fronts: the model's own calls in the answers relayed, checked once relayed.

The tap hands over each response it recorded (the objects it parsed for the ledger, never
parsed again); once the answer has gone to the client, `EmittedChecks.start` judges their
function_calls, off the relay's path (in a task when a schema must be compiled first). Every
call is counted (`replay_proxy_emitted_calls_total{tool,verdict}`); a response with a failing
call gets one audit record, `event: emitted_call_rejected`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.admission.routing import RouteCaches
from proxy.gate.arguments import compile_schemas
from proxy.gate.caches import GateCaches
from proxy.gate.emitted import Emitted, ToolSchemas, emitted_calls, iter_emitted, listed_tools
from proxy.gate.policy import Policy
from proxy.gate.schemas import LRU
from proxy.gate.verdict import Bounds
from proxy.state.audit import AuditLog, Relayed, emitted_record
from proxy.state.metrics import Metrics
from proxy.state.recording import Context

log = logging.getLogger("replay_proxy")

# Tool names come from the model and the client: past this many, new ones share one label.
MAX_TOOL_LABELS = 256
# The tool sets whose schemas are kept looked up, by the hash the ledger stores them under.
MAX_TOOL_SETS = 1024
UNKNOWN_TOOL = "(unknown)"
OTHER_TOOL = "(other)"
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

_Calls = list[tuple[int, Mapping[str, Any]]]
DEFAULT_BOUNDS = Bounds()


@dataclass(frozen=True, slots=True)
class _Answered:
    """One response that held function_calls, the function tools of its request, the policy
    of the route that request took (None: the config's gate), what its record may list, as
    the config in force at that request bounds it, and that request (None: the one its
    `EmittedCalls` names; a WebSocket turn's is its frame)."""

    response: Mapping[str, Any]
    tools: tuple[tuple[str, Any], ...]
    tools_key: str | None
    calls: _Calls
    policy: Policy | None
    bounds: Bounds
    # The MCP tools the lists of the response and its request name; the tools its request's
    # `tool_choice` allows (None: any).
    listed: Mapping[str, list[Any]]
    allowed: frozenset[str] | None
    relayed: Relayed | None = None


@dataclass
class EmittedCalls:
    """The responses with function_calls the tap recorded for one request (or one WebSocket
    connection), waiting to be checked, and the request they answer."""

    relayed: Relayed
    found: list[_Answered] = field(default_factory=list)

    def add(
        self,
        response: Mapping[str, Any],
        context: Context | None,
        policy: Policy | None = None,
        bounds: Bounds | None = None,
        relayed: Relayed | None = None,
    ) -> None:
        """A response the tap recorded, with the context of the request (or frame) that
        created it, the policy of the route it took, the bounds of its config, and (a
        WebSocket's turn) the frame that asked for it."""
        calls = emitted_calls(response.get("output"))
        if calls:
            tools, key = (context.tools, context.tools_key) if context else ((), None)
            inputs = context.items if context else ()
            listed = listed_tools(inputs, response.get("output"))
            allowed = context.allowed if context else None
            bounds = bounds or DEFAULT_BOUNDS
            self.found.append(
                _Answered(response, tools, key, calls, policy, bounds, listed, allowed, relayed)
            )

    def take(self) -> list[_Answered]:
        found, self.found = self.found, []
        return found


class EmittedChecks:
    """The checks of one process's door 2. A check whose schemas are all compiled is done at
    once (the answer has gone out; only this connection's next request waits, by the time a
    verdict takes); one that must compile a schema first is a task, kept until it is done and
    cancelled when the process stops."""

    def __init__(self, audit_log: AuditLog, metrics: Metrics) -> None:
        self.audit_log = audit_log
        self.metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()
        self._tool_labels: set[str] = set()
        # By tool set and the caches of a policy (a route of its own may have one).
        self._tool_sets: LRU[tuple[str | None, int], ToolSchemas] = LRU(MAX_TOOL_SETS)

    def start(self, calls: EmittedCalls, policy: Policy, caches: GateCaches) -> None:
        """Check what `calls` holds now, under this policy and its caches; the answer that
        held them has been relayed. Never raises: a failure of the check is logged."""
        self._start(calls.relayed, calls.take(), policy, caches)

    def _start(
        self, relayed: Relayed, found: list[_Answered], policy: Policy, caches: GateCaches
    ) -> None:
        if not found:
            return
        try:
            judged = [(a, self._schemas(a, policy, caches)) for a in found]
            pending = [s for answered, schemas in judged for s in schemas.pending(answered.calls)]
            if not pending:
                self._judge_all(relayed, judged)
                return
        except Exception:
            log.exception("%s checking the calls an upstream emitted failed", relayed.request_id)
            return
        task = asyncio.create_task(self._check(relayed, judged, pending, policy, caches))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def relayed(self, calls: EmittedCalls | None, gate: Policy, caches: RouteCaches) -> None:
        """The answer that held `calls` has been relayed (or cut short: the calls the client
        got count): check each response's under the policy of the route its request took
        (`gate`, the config's, when it took none of its own)."""
        if calls is None or not calls.found:
            return
        by_policy: dict[int, tuple[Policy, list[_Answered]]] = {}
        for answered in calls.take():
            policy = answered.policy or gate
            by_policy.setdefault(id(policy), (policy, []))[1].append(answered)
        for policy, found in by_policy.values():
            self._start(calls.relayed, found, policy, caches.of(policy))

    async def wait(self) -> None:
        """Until every check started so far is done."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _check(
        self,
        relayed: Relayed,
        judged: list[tuple[_Answered, ToolSchemas]],
        pending: list[Any],
        policy: Policy,
        caches: GateCaches,
    ) -> None:
        try:
            # As at admission: a large schema first seen is compiled off the event loop.
            await asyncio.to_thread(compile_schemas, pending, policy, caches)
            self._judge_all(relayed, judged)
        except Exception:
            log.exception("%s checking the calls an upstream emitted failed", relayed.request_id)

    def _judge_all(self, relayed: Relayed, judged: list[tuple[_Answered, ToolSchemas]]) -> None:
        for answered, schemas in judged:
            self._judge(relayed, answered, schemas)

    def _schemas(self, answered: _Answered, policy: Policy, caches: GateCaches) -> ToolSchemas:
        """The schemas of the answered request's tools, looked up once per tool set (keyed by
        the hash admission made of them for the ledger) under the policy in force."""
        key = (answered.tools_key, id(caches))
        found = self._tool_sets.get(key)
        if found is None or found.caches is not caches or found.policy is not policy:
            found = ToolSchemas(answered.tools, policy, caches)
            self._tool_sets.put(key, found)
        return found

    def _judge(self, relayed: Relayed, answered: _Answered, schemas: ToolSchemas) -> None:
        bounds = answered.bounds
        judged = list(
            iter_emitted(
                answered.calls, schemas, bounds.max_violations, answered.listed, answered.allowed
            )
        )
        failed = [e.finding for e in judged if e.finding is not None]
        if failed:
            entry = emitted_record(
                answered.relayed or relayed,
                answered.response,
                failed,
                include_arguments=self.audit_log.include_arguments,
                max_findings=bounds.max_findings,
            )
            self.audit_log.append(entry)
        # Counted once the record is written: a count seen means its record is there.
        for emitted in judged:
            self.metrics.emitted_calls.labels(self._label(emitted), emitted.verdict).inc()

    def _label(self, emitted: Emitted) -> str:
        """The call's tool as a label: a name with a schema, bounded in number."""
        return self.tool_label(emitted.name, known=emitted.known_tool)

    def tool_label(self, name: str | None, *, known: bool) -> str:
        """A tool's name as a label (`known`: a schema is known for it), bounded in number."""
        if name is None or not known or not _NAME.fullmatch(name):
            return UNKNOWN_TOOL
        if name not in self._tool_labels:
            if len(self._tool_labels) >= MAX_TOOL_LABELS:
                return OTHER_TOOL
            self._tool_labels.add(name)
        return name
