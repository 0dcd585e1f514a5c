"""A loaded config looked at again: what it likely gets wrong (warnings), whether what it names
can be reached (`config check --connect`), and the one line that says it at start."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

from proxy.config import Config
from proxy.gate.pins import accepts_everything
from proxy.gate.policy import Policy
from proxy.settings import LedgerSettings, UpstreamSettings


def iter_warnings(config: Config) -> Iterator[str]:
    """What loads but likely does not do what was meant, each naming its key: an upstream URL
    ending in /v1 (the client's path carries /v1 already), a pin that accepts every call."""
    for key, upstream in _iter_upstreams(config):
        parts = urlsplit(upstream.url)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            without = parts._replace(path=base.removesuffix("/v1")).geturl()
            yield (
                f"{key}.url: {upstream.url} ends in /v1, which every client path carries "
                f"already: a request to /v1/responses goes to {base}/v1/responses; give the "
                f"URL without /v1 ({without})"
            )
    yield from _iter_open_pins("tools", config.gate, None)
    for index, route in enumerate(config.routes):
        yield from _iter_open_pins(f"routes[{index}].gate.tools", route.gate, config.gate)


def _iter_upstreams(config: Config) -> Iterator[tuple[str, UpstreamSettings]]:
    if not config.upstreams:
        yield "upstream", config.upstream
    for name, upstream in config.upstreams.items():
        yield f"upstreams.{name}", upstream


def _iter_open_pins(key: str, policy: Policy, inherited: Policy | None) -> Iterator[str]:
    for name, compiled in policy.pinned.items():
        if inherited is not None and inherited.tools.get(name) is policy.tools[name]:
            continue  # the top-level pin, warned about once
        if accepts_everything(compiled.validator.schema):
            yield (
                f"{key}.{name}: the pinned schema accepts every call: it wins over the "
                "request's own schema, so no arguments of this tool are checked"
            )


def iter_unreachable(config: Config) -> Iterator[str]:
    """What `serve` would need and cannot have, each naming its key: an upstream or MCP server
    that takes no connection (TCP, then TLS for https; directly, not through a forward proxy),
    a Redis ledger that does not answer PING, an audit file that cannot be appended to."""
    servers = ((f"mcp.servers.{n}", s.upstream) for n, s in config.mcp.servers.items())
    for key, upstream in (*_iter_upstreams(config), *servers):
        problem = _connect(upstream)
        if problem is not None:
            yield f"{key}.url: {problem}"
    if config.ledger.backend == "redis":
        problem = _ping(config.ledger)
        if problem is not None:
            yield f"ledger.url: {problem}"
    if config.audit.path != "-":
        problem = _appendable(config.audit.path)
        if problem is not None:
            yield f"audit.path: cannot append to {config.audit.path!r}: {problem}"


def _connect(upstream: UpstreamSettings) -> str | None:
    parts = urlsplit(upstream.url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{host}:{port}"
    import ssl  # here: only an https upstream needs it

    try:
        with socket.create_connection((host, port), timeout=upstream.connect_timeout_s) as tcp:
            if parts.scheme != "https":
                return None
            context = ssl.create_default_context(cafile=upstream.ca_file)
            if upstream.client_cert is not None:
                context.load_cert_chain(upstream.client_cert, upstream.client_key)
            with context.wrap_socket(tcp, server_hostname=host):
                return None
    except ssl.SSLError as exc:
        return f"no TLS with {where}: {exc.reason or exc}"
    except OSError as exc:
        return f"cannot connect to {where}: {exc.strerror or exc}"


def _ping(ledger: LedgerSettings) -> str | None:
    import redis  # here: only a Redis ledger needs the client

    client = redis.Redis.from_url(
        ledger.url, socket_timeout=ledger.timeout_s, socket_connect_timeout=ledger.timeout_s
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis does not answer PING: {exc}"
    finally:
        client.close()
    return None


def _appendable(path: str) -> str | None:
    """Why `path` cannot be appended to, without writing to it (nor making it)."""
    if os.path.isdir(path):
        return "Is a directory"
    if os.path.exists(path):
        try:
            with open(path, "ab"):
                return None
        except OSError as exc:
            return exc.strerror or str(exc)
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return "No such file or directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return "Permission denied"
    return None


def describe(config: Config, workers: int) -> str:
    """The config in force, as the start's second line says it."""
    upstreams = ", ".join(f"{name}={u.url}" for name, u in config.upstream_named.items())
    mcp = ", ".join(f"{name}={s.upstream.url}" for name, s in config.mcp.servers.items())
    gate = config.gate
    overrides = ", ".join(f"{reason}: {action}" for reason, action in sorted(gate.actions.items()))
    pinned = set(gate.pinned).union(*(route.gate.pinned for route in config.routing))
    tls = "off" if config.listen.tls is None else "on"
    if config.listen.tls is not None and config.listen.tls.client_ca_file is not None:
        tls = "on, clients need a certificate"
    routes = len(config.routing)
    return "; ".join(
        [
            f"upstreams {upstreams}",
            *([f"MCP servers {mcp}"] if mcp else []),
            f"{routes} route{'s' if routes != 1 else ''}",
            f"ledger {_ledger_said(config.ledger)}",
            f"audit {'stdout' if config.audit.path == '-' else config.audit.path}",
            f"gate {gate.action}" + (f" ({overrides})" if overrides else ""),
            f"{len(pinned)} pinned tool{'s' if len(pinned) != 1 else ''}",
            f"{workers} worker{'s' if workers != 1 else ''}",
            f"TLS {tls}",
        ]
    )


def _ledger_said(ledger: LedgerSettings) -> str:
    if ledger.backend != "redis":
        return f"{ledger.backend} (this process only)"
    parts = urlsplit(ledger.url)  # without a password the URL may carry
    where = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
    return f"redis {parts.scheme}://{where}"
