"""The frozen settings sections of a config; they import nothing of the proxy's own."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl


# A vendor slug as item types carry it before their colon (`openai:web_search_call`).
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ConfigError(Exception):
    """The config cannot be used: one problem or several, each naming its key; the message
    is one line a problem."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ListenTls:
    """TLS on the listener: the certificate chain and its key (PEM), and with `client_ca_file`
    mutual TLS: a client must show a certificate that CA issued."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "client_ca_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: {path!r} is not a readable file")
        self.context()  # a file that does not load stops the start, naming its key

    def context(self) -> ssl.SSLContext:
        """The server's TLS context, built from the files as they are now."""
        import ssl  # here: only a config with TLS pays for loading it

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"cert_file: {self.cert_file!r} with key_file {self.key_file!r} is not a "
                f"certificate and its key: {exc}"
            ) from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"client_ca_file: {self.client_ca_file!r} holds no CA certificate: {exc}"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8787
    shutdown_grace_s: float = 30.0
    # A connection must send a whole request head this long after it opened or after its
    # previous answer, or it is closed (aiohttp's keep-alive timer, which also closes an idle
    # keep-alive connection). Longer than the 60 s idle timeout of common load balancers in
    # front, so that they never send a request on a connection the proxy has just closed.
    header_timeout_s: float = 75.0
    tls: ListenTls | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tls, Mapping):  # as the config file gives it
            try:
                object.__setattr__(self, "tls", ListenTls(**self.tls))
            except ValueError as exc:
                raise ValueError(f"tls.{exc}") from None

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"


@dataclass(frozen=True)
class AdminListen:
    """Where the admin endpoints (`/-/…`) are served instead of the data listener."""

    port: int
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class Admin:
    listen: AdminListen | None = None

    def __post_init__(self) -> None:
        if isinstance(self.listen, Mapping):  # as the config file gives it
            object.__setattr__(self, "listen", AdminListen(**self.listen))


@dataclass(frozen=True)
class UpstreamSettings:
    url: str = "http://127.0.0.1:8000"
    # Its vendor slug: items typed `<vendor>:...` are its own (another upstream's are foreign).
    vendor: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    api_key_env: str | None = None
    # Connections open to the upstream at once, in use or idle; a request waits for one. A
    # streamed answer holds its connection as long as it lasts: this bounds the streams open
    # at once too (two file descriptors each, with the client's).
    max_connections: int = 4096
    # An idle connection is closed after this long: keep it below the upstream's own idle
    # timeout (its `Keep-Alive: timeout=`), since a POST sent on a connection the upstream has
    # just closed fails (only an idempotent request is retried). 4 s is under the 5 s of
    # uvicorn's and Node's defaults, the shortest common ones.
    keepalive_s: float = 4.0
    # TLS: the CA bundle the upstream's certificate is checked against (default: the
    # system's), and a client certificate with its key for an upstream that asks for one.
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    # Honour HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY, as curl and httpx do.
    trust_env: bool = True
    # The key itself, read from `api_key_env` by the command line; never printed.
    api_key: str | None = field(default=None, repr=False)
    # The forward proxy the hop goes through, chosen from the environment by the command
    # line (`trust_env`); not printed: it may carry credentials.
    proxy: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.vendor is not None and not _SLUG.fullmatch(self.vendor):
            raise ValueError(
                f"vendor: {self.vendor!r} is not a vendor slug (letters, digits, `_`, `-`, `.`; "
                "no `:`)"
            )
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: {self.url!r} is not an http(s) URL with a host")
        if parts.query or parts.fragment:
            raise ValueError(f"url: {self.url!r} may not carry a query or fragment")
        if parts.username is not None or parts.password is not None:
            # Not echoed: it holds a secret. The upstream hop would not send it either.
            raise ValueError(
                "url: may not carry credentials (user:password@); the proxy sends the "
                "upstream a key from upstream.api_key_env"
            )
        if (self.client_cert is None) != (self.client_key is None):
            missing = "client_key" if self.client_key is None else "client_cert"
            raise ValueError(f"{missing}: client_cert and client_key are given together")
        for name in ("ca_file", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: {path!r} is not a readable file")
        if self.ca_file is not None or self.client_cert is not None:
            self._check_tls_files()

    def _check_tls_files(self) -> None:
        """Load the TLS files once, so that one that is not PEM stops the start naming its
        key; the upstream hop loads them again into its own context."""
        import ssl  # here: only a config that names TLS files pays for loading it

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # empty: no system store to load
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"ca_file: {self.ca_file!r} holds no CA certificate: {exc}") from None
        try:
            if self.client_cert is not None:
                context.load_cert_chain(self.client_cert, self.client_key)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"client_cert: {self.client_cert!r} with client_key {self.client_key!r} is not "
                f"a certificate and its key: {exc}"
            ) from None


# The actions an MCP `tools/call` may take: `strip` has nothing to remove from one call.
McpAction = Literal["rewrite", "block", "log"]
MCP_ACTIONS: tuple[McpAction, ...] = ("rewrite", "block", "log")


@dataclass(frozen=True)
class McpServer:
    """An MCP server the proxy serves at `/mcp/<name>` (Streamable HTTP): where it is (its
    endpoint's whole URL), the key the proxy sends it, and headers sent with every request."""

    upstream: UpstreamSettings
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Mcp:
    """The MCP servers by name, and what a `tools/call` that fails its schema gets."""

    servers: Mapping[str, McpServer] = field(default_factory=dict)
    action: McpAction = "rewrite"

    def __post_init__(self) -> None:
        if self.action not in MCP_ACTIONS:
            raise ValueError(f"action: {self.action!r} is not one of {', '.join(MCP_ACTIONS)}")


@dataclass(frozen=True)
class Client:
    """A client allowed through: its name (the tenant) and the sha256 of its key."""

    name: str
    key_sha256: str


@dataclass(frozen=True)
class Extproc:
    """`replay-proxy extproc`: where the External Processor listens for Envoy's gRPC streams,
    `HOST:PORT` (`[::1]:PORT` for IPv6; port 0 = any free one) or `unix:PATH`."""

    listen: str = "127.0.0.1:9002"

    def __post_init__(self) -> None:
        problem = listen_problem(self.listen)
        if problem is not None:
            raise ValueError(f"listen: {problem}")


def listen_problem(address: str) -> str | None:
    """Why `address` is not `HOST:PORT` or `unix:PATH`; None when it is one."""
    if address.startswith("unix:"):
        return None if address[5:] else f"{address!r} names no socket path after unix:"
    host, sep, port = address.rpartition(":")
    if not sep or not host or host in ("[]",):
        return f"{address!r} is not HOST:PORT or unix:PATH"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"{address!r}: the port must be 0 to 65535 (0 = any free one)"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"{address!r}: an IPv6 address goes in brackets ([::1]:PORT)"
    return None


@dataclass(frozen=True)
class Audit:
    path: str = "-"
    include_arguments: bool = False
    max_bytes: int | None = None


@dataclass(frozen=True)
class LedgerSettings:
    backend: str = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    ttl_s: float = 86400.0
    max_responses: int = 25_000
    # None: a fifth of max_responses (`per_tenant`).
    max_responses_per_tenant: int | None = None
    max_chain: int = 64
    timeout_s: float = 1.0
    fail_open: bool = False
    # Keep each relayed response's input and output items whole (not only what the gate needs),
    # so that a route with `materialize: true` can inline a conversation's history for another
    # upstream. It costs what the items weigh: see docs/routes.md ("Switching providers").
    whole_items: bool = False

    @property
    def per_tenant(self) -> int:
        """How many responses one tenant may hold in the memory backend."""
        if self.max_responses_per_tenant is not None:
            return self.max_responses_per_tenant
        return max(1, self.max_responses // 5)

    def __post_init__(self) -> None:
        if self.backend == "redis" and importlib.util.find_spec("redis") is None:
            raise ValueError(
                "backend: redis needs the redis client: pip install 'replay-proxy[redis]'"
            )


READINESS_LEDGER = ("reported", "required")


@dataclass(frozen=True)
class ReadinessSettings:
    """What `/-/ready` turns on. The ledger's check is always listed; `ledger: reported` leaves
    the answer 200 when only the ledger fails (first turns still work, and every replica shares
    one Redis: all of them would leave the Service at once), `required` makes it a 503."""

    ledger: str = "reported"

    def __post_init__(self) -> None:
        if self.ledger not in READINESS_LEDGER:
            raise ValueError(f"ledger: {self.ledger!r} is not one of {', '.join(READINESS_LEDGER)}")


@dataclass(frozen=True)
class Limits:
    """What one request may take and what its answer may say. Raises ValueError naming a count
    that is not a positive integer."""

    # Also the largest body the proxy forwards after stripping or rewriting a gated one.
    max_body_bytes: int = 64 * 1024 * 1024
    # A gated body must arrive whole this long after its head, or it is answered 408: the
    # proxy holds the body until it can judge it, so a client sending a byte a second would
    # hold a connection, a handler and a buffer for as long as it liked.
    body_timeout_s: float = 60.0
    # What a blocked answer, an audit record or a WebSocket error event lists: at most this
    # many findings, and this many violations (`fail` entries) per finding and failure record;
    # what is left out is counted. So a small request cannot make a large answer.
    max_findings: int = 100
    max_violations: int = 20

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_findings", "max_violations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} is not a positive integer")


@dataclass(frozen=True)
class Log:
    """The operational log on stderr: one line per event, `text` for people, `json` (one object
    a line) for a log shipper."""

    format: str = "text"

    def __post_init__(self) -> None:
        if self.format not in LOG_FORMATS:
            raise ValueError(f"format: {self.format!r} is not one of {', '.join(LOG_FORMATS)}")


LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class TracingSettings:
    """Traces over OTLP (the `otel` extra): a span per request. `endpoint` is the collector's
    OTLP/HTTP traces URL; None leaves it to the standard OTEL_EXPORTER_OTLP_* environment."""

    enabled: bool = False
    endpoint: str | None = None
    service_name: str = "replay-proxy"

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint: {self.endpoint!r} is not an http(s) URL with a host")
        if self.enabled and not _installed("opentelemetry.sdk"):
            raise ValueError("enabled: traces need OpenTelemetry: pip install 'replay-proxy[otel]'")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
