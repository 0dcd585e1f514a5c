"""The host's own check, without a proxy: may this call run? The gate's verdict on one call.

A host that executes tools checks the model's call against the tool's schema before it runs it
(a `function_call` in the history is not enough). `check_call` gives the same verdict as the
proxy's gate, with the same failure record a `rewrite` sends the model:

    >>> from proxy.gate.host import check_call
    >>> record = check_call(call, schema)            # or tools=request["tools"]
    >>> if not record["execute"]: send(record)       # as the call's function_call_output

Importing it loads jsonschema and regex, never the HTTP stack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.gate.policy import Policy
from proxy.gate.records import failure_record
from proxy.gate.verdict import inspect


def check_call(
    call: Mapping[str, Any],
    schema: Mapping[str, Any] | bool | None = None,
    *,
    tools: Sequence[Any] | None = None,
    allow_missing_status: bool = True,
) -> dict[str, Any]:
    """The verdict on one `function_call` item: `execute` true when it may run.

    The schema is `schema` (the tool's `parameters`), else the function tool of `tools` with
    the call's name. A failure is the gate's failure record (`success: false`, `execute:
    false`, `check`, `reason`, `pass`, `fail`, `error`); a pass is the same shape with
    `success` and `execute` true, `reason: "ok"` and the top-level properties in `pass`.
    A call the model has just emitted often carries no `status`, so a missing one passes
    unless `allow_missing_status=False`; any other status than `completed` fails.
    """
    name = call.get("name")
    if schema is not None:
        tools = [{"type": "function", "name": name, "parameters": schema}]
    call_id = call.get("call_id")
    body = {
        "tools": list(tools or ()),
        "input": [dict(call), {"type": "function_call_output", "call_id": call_id, "output": ""}],
    }
    verdict = inspect(body, Policy(allow_missing_status=allow_missing_status))
    if verdict.findings:
        return failure_record(verdict.findings[0])
    return {
        "success": True,
        "execute": True,
        "check": name,
        "reason": "ok",
        "pass": _properties(call.get("arguments")),
        "fail": [],
        "error": None,
    }


def _properties(arguments: Any) -> list[str]:
    # The call passed the gate, so its arguments are one strict JSON value.
    value = json.loads(arguments) if isinstance(arguments, str) else None
    return sorted(value) if isinstance(value, dict) else []
