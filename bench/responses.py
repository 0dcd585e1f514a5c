"""The responses the ledger benchmarks record: a typical tool turn, its follow-up, and responses
of a chosen shape, every id numbered so that no two recordings share one."""

from __future__ import annotations

from typing import Any


def response(n: int) -> dict[str, Any]:
    """A typical tool turn: a reasoning item, a function call, and a short message."""
    return {
        "id": f"resp_{n:012d}",
        "object": "response",
        "previous_response_id": f"resp_{n - 1:012d}" if n else None,
        "output": [
            {"type": "reasoning", "id": f"rs_{n:012d}", "summary": []},
            {
                "type": "function_call",
                "id": f"fc_{n:012d}",
                "call_id": f"call_{n:012d}",
                "name": "get_latest_sales_report",
                "status": "completed",
                "arguments": '{"region":"emea","week":"2026-W47"}',
            },
            {
                "type": "message",
                "id": f"msg_{n:012d}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "Checking the report.", "annotations": []}
                ],
            },
        ],
    }


def follow_up(n: int) -> dict[str, Any]:
    call = f"call_{n:012d}"
    return {
        "previous_response_id": f"resp_{n:012d}",
        "input": [{"type": "function_call_output", "call_id": call, "output": "ok"}],
    }


TOOLS = (("get_latest_sales_report", {"type": "object", "properties": {"region": {}}}),)


def call_item(n: int, k: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n:012d}_{k}",
        "call_id": f"call_{n:012d}_{k}",
        "name": "get_latest_sales_report",
        "status": "completed",
        "arguments": '{"region":"emea","week":"2026-W47"}',
    }


def message_item(n: int, k: int) -> dict[str, Any]:
    text = [{"type": "output_text", "text": "Checking the report.", "annotations": []}]
    return {"type": "message", "id": f"msg_{n:012d}_{k}", "role": "assistant", "content": text}


def shaped(n: int, calls: int, messages: int, inputs: int) -> tuple[dict[str, Any], list[Any]]:
    """A response with `calls` calls and `messages` messages in its output, made by a request
    that sent `inputs` unanswered calls (and offered one tool)."""
    output = [call_item(n, k) for k in range(calls)] + [message_item(n, k) for k in range(messages)]
    sent = [call_item(n, 100 + k) for k in range(inputs)]
    return {"id": f"resp_{n:012d}", "object": "response", "output": output}, sent
