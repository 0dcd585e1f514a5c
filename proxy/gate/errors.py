"""The proxy's own failures: one error type, and the API's error shape every one of them takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def error_document(
    type_: str,
    code: str,
    message: str,
    param: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The API's `{"error": {...}}`; `extra` adds fields after the spec's four (`findings`,
    `request_id`)."""
    return {"error": {"type": type_, "code": code, "param": param, "message": message, **extra}}


@dataclass(frozen=True)
class ProxyError(Exception):
    """A request the proxy answers itself, raised where the failure is decided and turned into
    an answer in one place: its status, the API's `code`, a message for the client (never an
    address or a socket's error: those go to the log), headers to add, and the error `type`.

    `type` left empty is the spec's mapping: `server_error` for a 5xx, else
    `invalid_request_error`. `close` ends the connection after the answer, for a request whose
    body was not read to its end.
    """

    status: int
    code: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    type: str = ""
    param: str | None = None
    close: bool = False

    def __post_init__(self) -> None:
        if not self.type:
            kind = "server_error" if self.status >= 500 else "invalid_request_error"
            object.__setattr__(self, "type", kind)

    def __str__(self) -> str:
        return self.message

    def document(self) -> dict[str, Any]:
        """The body of the answer: the API's error shape."""
        return error_document(self.type, self.code, self.message, self.param)


def internal_error(request_id: str) -> ProxyError:
    """The answer to a failure nobody decided: a bug of the proxy's, named by the request id
    that finds its traceback in the log."""
    return ProxyError(
        500,
        "internal_error",
        f"internal_error: the proxy failed on this request; its log has {request_id}",
    )
