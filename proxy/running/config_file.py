"""The YAML config file: its schema, and loading it into a Config naming every mistake."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from proxy.config import Config, Route
from proxy.gate.policy import Policy, PolicyError
from proxy.gate.reasons import ACTIONS, ALL_REASONS
from proxy.settings import (
    LOG_FORMATS,
    MCP_ACTIONS,
    READINESS_LEDGER,
    Admin,
    Audit,
    Client,
    ConfigError,
    Extproc,
    LedgerSettings,
    Limits,
    Listen,
    Log,
    Mcp,
    McpServer,
    ReadinessSettings,
    TracingSettings,
    UpstreamSettings,
)


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


_SECONDS = {"type": "number", "exclusiveMinimum": 0}

_ACTION = {"enum": list(ACTIONS)}

_UPSTREAM: dict[str, Any] = {
    "url": {"type": "string", "minLength": 1},
    "connect_timeout_s": _SECONDS,
    "read_timeout_s": _SECONDS,
    "api_key_env": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
    "max_connections": {"type": "integer", "minimum": 1},
    "keepalive_s": _SECONDS,
    "ca_file": {"type": "string", "minLength": 1},
    "client_cert": {"type": "string", "minLength": 1},
    "client_key": {"type": "string", "minLength": 1},
    "trust_env": {"type": "boolean"},
}

_GATE: dict[str, Any] = {
    "action": _ACTION,
    "actions": {
        "type": "object",
        "propertyNames": {"enum": list(ALL_REASONS)},
        "additionalProperties": _ACTION,
    },
    "allow_missing_status": {"type": "boolean"},
    "require_provenance": {"type": "boolean"},
    "max_cached_verdicts": {"type": "integer", "minimum": 1},
    "validation_timeout_s": _SECONDS,
    "schema_limits": _object(
        {
            name: {"type": "integer", "minimum": 1}
            for name in (
                "max_bytes",
                "max_depth",
                "max_subschemas",
                "max_pattern_length",
            )
        }
    ),
}

_TOOLS = {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}}

# An upstream's name: it labels metrics and audit records.
_NAME = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# A tenant's fingerprint, as the audit log writes it (proxy.state.audit.tenant_of).
_FINGERPRINT = "^t_[0-9a-f]{16}$"
# A header name (RFC 9110 §5.6.2 token).
_TOKEN = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"

# The shape of the file; values are checked further where the dataclasses are built.
CONFIG_SCHEMA: dict[str, Any] = _object(
    {
        "listen": _object(
            {
                "host": {"type": "string", "minLength": 1},
                "port": {"type": "integer", "minimum": 0, "maximum": 65535},
                "shutdown_grace_s": {"type": "number", "minimum": 0},
                "header_timeout_s": _SECONDS,
                "tls": {
                    **_object(
                        {
                            "cert_file": {"type": "string", "minLength": 1},
                            "key_file": {"type": "string", "minLength": 1},
                            "client_ca_file": {"type": "string", "minLength": 1},
                        }
                    ),
                    "required": ["cert_file", "key_file"],
                },
            }
        ),
        "upstream": _object(_UPSTREAM),
        # The named form: either `upstream:` or `upstreams:` (with `routes:`), never both.
        "upstreams": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": _NAME},
            "additionalProperties": {
                **_object({**_UPSTREAM, "vendor": {"type": "string", "minLength": 1}}),
                "required": ["url"],
            },
        },
        "routes": {
            "type": "array",
            "minItems": 1,
            "items": {
                **_object(
                    {
                        "path_prefix": {"type": "string", "pattern": "^/"},
                        "model": {"type": "string", "minLength": 1},
                        "strip_model_prefix": {"type": "boolean"},
                        "header": {
                            **_object(
                                {
                                    "name": {"type": "string", "pattern": _TOKEN},
                                    "value": {"type": "string"},
                                }
                            ),
                            "required": ["name", "value"],
                        },
                        "upstream": {"type": "string", "minLength": 1},
                        "materialize": {"type": "boolean"},
                        # The top-level gate's keys, and pinned tools, over its values.
                        "gate": _object({**_GATE, "tools": _TOOLS}),
                    }
                ),
                "required": ["upstream"],
            },
        },
        "gate": _object(_GATE),
        "tools": _TOOLS,
        "clients": {
            "type": "array",
            "items": {
                **_object(
                    {
                        "name": {"type": "string", "minLength": 1},
                        "key_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    }
                ),
                "required": ["name", "key_sha256"],
            },
        },
        "tenants": {
            "type": "object",
            "propertyNames": {"pattern": _FINGERPRINT},
            "additionalProperties": {"type": "string", "minLength": 1},
        },
        "audit": _object(
            {
                "path": {"type": "string", "minLength": 1},
                "include_arguments": {"type": "boolean"},
                "max_bytes": {"type": ["integer", "null"], "minimum": 1},
            }
        ),
        "ledger": _object(
            {
                "backend": {"enum": ["memory", "redis"]},
                "url": {"type": "string", "pattern": "^(redis|rediss|unix)://"},
                "ttl_s": _SECONDS,
                "max_responses": {"type": "integer", "minimum": 1},
                "max_responses_per_tenant": {"type": "integer", "minimum": 1},
                "max_chain": {"type": "integer", "minimum": 1},
                "timeout_s": _SECONDS,
                "fail_open": {"type": "boolean"},
                "whole_items": {"type": "boolean"},
            }
        ),
        "limits": _object(
            {
                "max_body_bytes": {"type": "integer", "minimum": 1},
                "body_timeout_s": _SECONDS,
                "max_findings": {"type": "integer", "minimum": 1},
                "max_violations": {"type": "integer", "minimum": 1},
            }
        ),
        "admin": _object(
            {
                "listen": {
                    **_object(
                        {
                            "host": {"type": "string", "minLength": 1},
                            "port": {"type": "integer", "minimum": 0, "maximum": 65535},
                        }
                    ),
                    "required": ["port"],
                },
            }
        ),
        "log": _object({"format": {"enum": list(LOG_FORMATS)}}),
        "tracing": _object(
            {
                "enabled": {"type": "boolean"},
                "endpoint": {"type": "string", "minLength": 1},
                "service_name": {"type": "string", "minLength": 1},
            }
        ),
        "extproc": _object({"listen": {"type": "string", "minLength": 1}}),
        "readiness": _object({"ledger": {"enum": list(READINESS_LEDGER)}}),
        "mcp": _object(
            {
                "servers": {
                    "type": "object",
                    "propertyNames": {"pattern": _NAME},
                    "additionalProperties": {
                        **_object(
                            {
                                "url": _UPSTREAM["url"],
                                "api_key_env": _UPSTREAM["api_key_env"],
                                "headers": {
                                    "type": "object",
                                    "propertyNames": {"pattern": _TOKEN},
                                    # No line break or other control character: a header value.
                                    "additionalProperties": {
                                        "type": "string",
                                        "pattern": "^[^\\x00-\\x08\\x0a-\\x1f\\x7f]*$",
                                    },
                                },
                            }
                        ),
                        "required": ["url"],
                    },
                },
                "action": {"enum": list(MCP_ACTIONS)},
            }
        ),
    }
)

_CONFIG_VALIDATOR = jsonschema.Draft202012Validator(CONFIG_SCHEMA)

# What each key of CONFIG_SCHEMA means, for `replay-proxy config defaults` (the defaults come from
# the dataclasses); a test checks that this names every key of the schema and nothing else.
MEANINGS: dict[str, str] = {
    "listen.host": "address to listen on",
    "listen.port": "port to listen on (0 = any free port, logged at start)",
    "listen.shutdown_grace_s": "on SIGTERM/SIGINT: seconds that requests in flight may still take",
    "listen.header_timeout_s": "a connection must send a whole request head this long after it "
    "opened or after its previous answer, else it is closed",
    "listen.tls.cert_file": "TLS on the listener: the certificate chain (PEM) it presents",
    "listen.tls.key_file": "the key of listen.tls.cert_file (PEM)",
    "listen.tls.client_ca_file": "mutual TLS: clients must show a certificate this CA issued",
    "upstream.url": "the Open Responses server (a base path is kept)",
    "upstream.connect_timeout_s": "no connection within this -> 504",
    "upstream.read_timeout_s": "no byte from the upstream within this -> 504 (or a cut stream)",
    "upstream.api_key_env": "the environment variable holding the provider key sent upstream",
    "upstream.max_connections": "connections open to the upstream at once; more requests wait",
    "upstream.keepalive_s": "an idle upstream connection is closed after this",
    "upstream.ca_file": "the CA bundle an https upstream is checked against (default: the "
    "system's)",
    "upstream.client_cert": "a client certificate (PEM) for an upstream that asks for one",
    "upstream.client_key": "the key of upstream.client_cert (both or neither)",
    "upstream.trust_env": "take a forward proxy from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / "
    "NO_PROXY",
    "upstreams": "name -> {url, vendor, api_key_env, ...the keys of upstream}: several "
    "providers (instead of upstream:); items typed <vendor>:... are native to one",
    "routes": "[{path_prefix | model (glob) | header: {name, value}, upstream, "
    "strip_model_prefix, materialize, gate}]: the upstream per request, first match wins; "
    "one without a matcher is the default",
    "mcp.servers": "name -> {url, api_key_env, headers}: an MCP server (Streamable HTTP, its "
    "endpoint's whole URL) served at /mcp/<name>; its tools/call arguments are gated against "
    "the inputSchema its tools/list gave the session",
    "mcp.action": "what a tools/call that fails its schema gets: rewrite (a tool error with the "
    "failure record, nothing forwarded) | block (JSON-RPC error -32602) | log (forwarded)",
    "gate.action": "what a finding does by default: " + " | ".join(ACTIONS),
    "gate.actions": "per-reason override of gate.action, e.g. {namespaced: strip}",
    "gate.allow_missing_status": "a function_call without status counts as completed",
    "gate.require_provenance": "only calls an upstream response emitted may be replayed",
    "gate.max_cached_verdicts": "remembered (schema, arguments) verdicts, least recent forgotten",
    "gate.validation_timeout_s": "the time all of one request's schema validations may take",
    "gate.schema_limits.max_bytes": "the largest tool schema, as JSON",
    "gate.schema_limits.max_depth": "how deep a tool schema's objects and arrays may nest",
    "gate.schema_limits.max_subschemas": "the most objects (subschemas) in a tool schema",
    "gate.schema_limits.max_pattern_length": "the longest pattern or patternProperties name",
    "tools": "tool name -> pinned JSON Schema, or the tool itself (Responses, Chat Completions "
    "or MCP shape, named as its key); wins over the request's tools",
    "clients": "[{name, key_sha256}]: only these keys get through (else 401); name = tenant",
    "tenants": "tenant fingerprint (t_..., as in the audit log) -> name: `audit report "
    "--config` shows the name beside it",
    "audit.path": '"-" = stdout, else a JSONL file appended to',
    "audit.include_arguments": "findings carry the raw arguments of the paired call",
    "audit.max_bytes": "rotate the file to <path>.1 (...5) past this size; the chain continues",
    "ledger.backend": "memory (per process: not with --workers N) | redis (shared by processes "
    "and machines)",
    "ledger.url": "the Redis server, for backend: redis",
    "ledger.ttl_s": "how long a relayed response is remembered",
    "ledger.max_responses": "the memory backend's bound (when full, the tenant holding the most "
    "loses its oldest)",
    "ledger.max_responses_per_tenant": "the memory backend's bound per tenant (its oldest "
    "forgotten); not set: a fifth of max_responses",
    "ledger.max_chain": "how many responses back a follow-up may pair its outputs",
    "ledger.timeout_s": "a slower ledger read or write is a fault",
    "ledger.fail_open": "true: an unknown previous response or a ledger fault lets an unpaired "
    "output through; false: orphan, and a fault is a 503 ledger_unavailable",
    "ledger.whole_items": "keep responses' items whole (needed by routes' materialize: true)",
    "limits.max_body_bytes": "the largest gated body, after content decoding (else 413) and "
    "after strip or rewrite (else blocked)",
    "limits.body_timeout_s": "a gated body must arrive whole this long after its head (else 408)",
    "limits.max_findings": "findings listed per blocked answer, audit record, WebSocket error "
    "(the rest counted)",
    "limits.max_violations": "fail entries listed per finding and failure record (the rest "
    "counted)",
    "admin.listen.host": "set: the admin endpoints (/-/...) are served here only, without a key",
    "admin.listen.port": "the port of admin.listen (0 = any free port, logged at start)",
    "log.format": "the log on stderr: text (for people) | json (one object a line, for shippers)",
    "tracing.enabled": "a span per request over OTLP (pip install 'replay-proxy[otel]')",
    "tracing.endpoint": "the collector's OTLP/HTTP traces URL (default: OTEL_EXPORTER_OTLP_* "
    "environment, else http://localhost:4318/v1/traces)",
    "tracing.service_name": "the service.name the spans carry",
    "extproc.listen": "`replay-proxy extproc`: HOST:PORT or unix:PATH for Envoy's gRPC streams",
    "readiness.ledger": "reported: /-/ready lists the ledger, stays 200 when only it fails | "
    "required: a ledger down is 503 (unless ledger.fail_open)",
}

# Where a key's default lives when it is not at the same path of Config().
_DEFAULT_AT = {"tools": ("gate", "tools")}


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice is an error instead of the last one winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; a ConfigError lists every mistake, each with its
    key and, where the file has it, its line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    loader = _UniqueKeyLoader(text)  # a SafeLoader: no arbitrary objects
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML{_at(exc)}: {_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    try:
        return parse_config({} if data is None else data)
    except ConfigError as exc:
        # In the file's order: a problem the file has no place for (a missing key) first.
        marked = sorted(((_mark(root, p), p) for p in exc.problems), key=lambda m: m[0] or (0, 0))
        raise ConfigError(
            *(f"{path}:{at[0]}:{at[1]}: {p}" if at else f"{path}: {p}" for at, p in marked)
        ) from None


def parse_config(data: Any) -> Config:
    """Build a Config from parsed YAML; a ConfigError lists every unknown key and bad value."""
    if not isinstance(data, dict):
        raise ConfigError("the config must be a mapping of sections")
    problems: list[str] = []
    config = _build(data, problems)
    if problems or config is None:
        raise ConfigError(*problems)
    return config


def _build(data: dict[str, Any], problems: list[str]) -> Config | None:
    """The Config, or None with `problems` told why. A section whose shape is wrong is not
    built further (its values are not what the dataclasses take); the others still are, so
    that one run names every mistake."""
    errors = sorted(_CONFIG_VALIDATOR.iter_errors(data), key=lambda e: list(map(str, e.path)))
    for error in errors:
        problems.extend(_iter_explained(error))
    broken = {str(error.absolute_path[0]) for error in errors if error.absolute_path}
    if "upstream" in data and "upstreams" in data:
        problems.append(
            "upstreams: give either upstream: (one provider) or upstreams: with routes:, not both"
        )
    if ("upstreams" in data) != ("routes" in data):
        given, missing = ("upstreams", "routes") if "upstreams" in data else ("routes", "upstreams")
        problems.append(f"{missing}: {given}: needs {missing}: too")
    sections: dict[str, Any] = {}
    for name, cls in (
        ("listen", Listen),
        ("upstream", UpstreamSettings),
        ("audit", Audit),
        ("ledger", LedgerSettings),
        ("limits", Limits),
        ("admin", Admin),
        ("log", Log),
        ("tracing", TracingSettings),
        ("extproc", Extproc),
        ("readiness", ReadinessSettings),
    ):
        if name not in broken:
            try:
                sections[name] = cls(**data.get(name, {}))
            except ValueError as exc:
                problems.append(f"{name}.{exc}")
    clients: tuple[Client, ...] = ()
    if "clients" not in broken:
        clients = tuple(Client(**c) for c in data.get("clients", ()))
        names = [c.name for c in clients]
        if len(set(names)) != len(names):
            problems.append("clients: two clients have the same name")
        if len({c.key_sha256 for c in clients}) != len(clients):
            problems.append("clients: two clients have the same key")
    gate = {} if "gate" in broken else data.get("gate", {})
    tools = {} if "tools" in broken else data.get("tools", {})
    policy = None
    try:
        policy = Policy(**gate, tools=tools)
    except ValueError as exc:
        problems.extend(p if p.startswith("tools.") else f"gate.{p}" for p in _problems_of(exc))
    if "gate" in broken and policy is not None:
        policy = None  # its pins were checked; the settings were not read
    upstreams = {} if "upstreams" in broken else _upstreams(data.get("upstreams", {}), problems)
    if "mcp" not in broken:
        sections["mcp"] = _mcp(data.get("mcp", {}), problems)
    routes = []
    ledger = sections.get("ledger")
    if not {"routes", "upstreams", "gate", "tools"} & broken and ledger is not None:
        said = set(problems)
        for index, route in enumerate(data.get("routes", ())):
            found: list[str] = []
            built = _route(index, route, upstreams, gate, tools, policy, ledger, found)
            # A mistake of the top-level gate is named once, not again for each route.
            problems.extend(p for p in found if _inherited(p) not in said)
            if built is not None:
                routes.append(built)
    if problems or policy is None:
        return None
    try:
        return Config(
            gate=policy,
            clients=clients,
            tenants=dict(data.get("tenants", {})),
            upstreams=upstreams,
            routes=tuple(routes),
            **sections,
        )
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None


def _problems_of(exc: ValueError) -> tuple[str, ...]:
    return exc.problems if isinstance(exc, PolicyError) else (str(exc),)


def _inherited(problem: str) -> str:
    """A route's gate problem as the top-level gate would say it."""
    _, _, rest = problem.partition(".gate.")
    return rest if rest.startswith("tools.") else f"gate.{rest}"


def _upstreams(data: Mapping[str, Any], problems: list[str]) -> dict[str, UpstreamSettings]:
    found = {}
    for name, settings in data.items():
        try:
            found[name] = UpstreamSettings(**settings)
        except ValueError as exc:
            problems.append(f"upstreams.{name}.{exc}")
    return found


def _mcp(data: Mapping[str, Any], problems: list[str]) -> Mcp:
    servers = {}
    for name, server in data.get("servers", {}).items():
        try:
            upstream = UpstreamSettings(url=server["url"], api_key_env=server.get("api_key_env"))
        except ValueError as exc:
            problems.append(f"mcp.servers.{name}.{exc}")
            continue
        headers = tuple(server.get("headers", {}).items())
        servers[name] = McpServer(upstream, headers)
    return Mcp(servers, data.get("action", "rewrite"))


def _route(
    index: int,
    data: Mapping[str, Any],
    upstreams: Mapping[str, UpstreamSettings],
    gate: Mapping[str, Any],
    tools: Mapping[str, Any],
    policy: Policy | None,
    ledger: LedgerSettings,
    problems: list[str],
) -> Route | None:
    """One entry of `routes:`, its policy the top-level gate with its own `gate:` over it;
    None with `problems` told why."""
    key = f"routes[{index}]"
    name = data["upstream"]
    if name not in upstreams:
        problems.append(
            f"{key}.upstream: {name!r} is not one of upstreams:"
            f" {', '.join(upstreams)}{_did_you_mean(name, list(upstreams))}"
        )
    if data.get("materialize") and not ledger.whole_items:
        problems.append(
            f"{key}.materialize: inlining a recorded conversation needs the whole items: "
            "set ledger.whole_items: true"
        )
    override = dict(data.get("gate", {}))
    vendor = upstreams[name].vendor if name in upstreams else None
    if override or vendor is not None:
        own_tools = override.pop("tools", {})
        actions = {**gate.get("actions", {}), **override.pop("actions", {})}
        try:
            policy = Policy(
                **{**gate, **override, "actions": actions},
                tools={**tools, **own_tools},
                vendor=vendor,
            )
        except ValueError as exc:
            problems.extend(f"{key}.gate.{p}" for p in _problems_of(exc))
            return None
    header = data.get("header")
    try:
        route = Route(
            name,
            path_prefix=data.get("path_prefix"),
            model=data.get("model"),
            strip_model_prefix=data.get("strip_model_prefix", False),
            header=None if header is None else (header["name"], header["value"]),
            materialize=data.get("materialize", False),
            gate=Policy() if policy is None else policy,
        )
    except ValueError as exc:
        problems.append(f"{key}.{exc}")
        return None
    return route if policy is not None and name in upstreams else None


def _mark(root: yaml.Node | None, problem: str) -> tuple[int, int] | None:
    """The line and column of the key a problem names (`routes[0].gate.tools.x: ...`), as
    deep as the file spells it out; None when the file does not hold even its first part."""
    node, rest, found = root, problem.partition(": ")[0], None
    while rest and node is not None:
        if isinstance(node, yaml.MappingNode):
            # The longest key that starts the rest: a tool's name may hold a dot.
            matches = [
                (str(k.value), k, v)
                for k, v in node.value
                if isinstance(k, yaml.ScalarNode)
                and rest.startswith(str(k.value))
                and rest[len(str(k.value)) : len(str(k.value)) + 1] in ("", ".", "[")
            ]
            if not matches:
                break
            name, found, node = max(matches, key=lambda match: len(match[0]))
            rest = rest[len(name) :].removeprefix(".")
        elif isinstance(node, yaml.SequenceNode):
            index = re.match(r"\[(\d+)\]\.?", rest)
            if index is None or int(index[1]) >= len(node.value):
                break
            node = found = node.value[int(index[1])]
            rest = rest[index.end() :]
        else:
            break
    if found is None:
        return None
    return found.start_mark.line + 1, found.start_mark.column + 1


def _at(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def _problem(exc: yaml.MarkedYAMLError) -> str:
    """What PyYAML says is wrong, without its `in "<unicode string>"` marks: the file and the
    line are named already."""
    said = [exc.context, exc.problem] if exc.context and exc.problem else [exc.problem]
    return ": ".join(str(part) for part in said if part) or "syntax error"


def _did_you_mean(word: object, choices: Iterator[str] | list[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def iter_defaults() -> Iterator[str]:
    """Every key of the config, as YAML: its default and, as a comment, its meaning. A key
    without a default is commented out; the lines are a config that loads as the defaults."""
    yield "# replay-proxy config: every key, its default, and what it means"
    yield from _iter_section(CONFIG_SCHEMA, (), "")


def iter_keys() -> Iterator[tuple[str, Any]]:
    """Every key of the config (a section's keys, not the section), dotted, with its default
    (None: not set)."""
    yield from _iter_keys(CONFIG_SCHEMA, ())


def _iter_keys(schema: Mapping[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    for name, inner in schema["properties"].items():
        here = (*path, name)
        if "properties" in inner:
            yield from _iter_keys(inner, here)
        else:
            yield ".".join(here), _default_of(here)


def _iter_section(schema: Mapping[str, Any], path: tuple[str, ...], indent: str) -> Iterator[str]:
    for name, inner in schema["properties"].items():
        here = (*path, name)
        if "properties" in inner:
            # A section that is off by default (listen.tls), or holds only such sections
            # (admin), is commented out with its keys.
            off = "# " if not _any_default(inner, here) else ""
            yield f"{indent}{off}{name}:"
            yield from _iter_section(inner, here, indent + "  ")
            continue
        default = _default_of(here)
        meaning = MEANINGS.get(".".join(here), "")
        if default is None:
            line, meaning = f"{indent}# {name}:", f"(not set) {meaning}"
        else:
            line = f"{indent}{name}: {json.dumps(default)}"
        yield f"{line:<44} # {meaning}"


def _any_default(schema: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    """Whether the section at `path` is set by default: it, and some key in it."""
    if _default_of(path) is None:
        return False
    if "properties" not in schema:
        return True
    return any(_any_default(inner, (*path, name)) for name, inner in schema["properties"].items())


def _default_of(path: tuple[str, ...]) -> Any:
    value: Any = Config()  # the dataclasses hold the defaults
    for part in _DEFAULT_AT.get(".".join(path), path):
        value = getattr(value, part, None)
    if path[0] in ("upstreams", "routes") and not value:
        return None  # the single upstream: form is the default
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _iter_explained(error: jsonschema.ValidationError) -> Iterator[str]:
    """The problems one schema error stands for: an unknown key each."""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        # key=str: YAML keys need not be strings, and 1 < "a" would raise.
        for unknown in sorted((k for k in error.instance if k not in known), key=str):
            key = f"{_where(error)}.{unknown}" if _where(error) else str(unknown)
            yield f"{key}: unknown key{_did_you_mean(unknown, list(known))}"
        return
    yield _explain(error)


def _where(error: jsonschema.ValidationError) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return where.removeprefix(".")


def _explain(error: jsonschema.ValidationError) -> str:
    where = _where(error)
    # A propertyNames failure reports the inner keyword (`enum`) with the property as instance.
    if "propertyNames" in error.relative_schema_path and where == "tenants":
        return (
            f"tenants.{error.instance}: not a tenant fingerprint (t_ and 16 hex digits, as the "
            "audit log's tenant)"
        )
    if "propertyNames" in error.relative_schema_path and error.validator == "pattern":
        return (
            f"{where}.{error.instance}: not a name for an upstream (letters, digits, `_`, `-`, "
            "`.`, at most 64)"
        )
    if "propertyNames" in error.relative_schema_path:
        reasons: list[str] = list(ALL_REASONS)
        return f"{where}.{error.instance}: unknown reason{_did_you_mean(error.instance, reasons)}"
    suggestion = ""
    allowed = error.validator_value
    if error.validator == "enum" and isinstance(error.instance, str) and isinstance(allowed, list):
        suggestion = _did_you_mean(error.instance, [str(v) for v in allowed])
    return f"{where or 'config'}: {error.message}{suggestion}"
