"""YAML config -> frozen, validated dataclasses; every mistake is a ConfigError naming its key."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import yaml

from proxy.gate import ACTIONS, ALL_REASONS, Policy


class ConfigError(Exception):
    """The config cannot be used; the message names the key."""


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


_SECONDS = {"type": "number", "exclusiveMinimum": 0}
_ACTION = {"enum": list(ACTIONS)}

# The shape of the file; values are checked further where the dataclasses are built.
CONFIG_SCHEMA: dict[str, Any] = _object(
    {
        "listen": _object(
            {
                "host": {"type": "string", "minLength": 1},
                "port": {"type": "integer", "minimum": 0, "maximum": 65535},
                "shutdown_grace_s": {"type": "number", "minimum": 0},
                "header_timeout_s": _SECONDS,
            }
        ),
        "upstream": _object(
            {
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
        ),
        "gate": _object(
            {
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
        ),
        "tools": {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}},
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
                "max_chain": {"type": "integer", "minimum": 1},
                "timeout_s": _SECONDS,
                "fail_open": {"type": "boolean"},
            }
        ),
        "limits": _object(
            {
                "max_body_bytes": {"type": "integer", "minimum": 1},
                "body_timeout_s": _SECONDS,
            }
        ),
    }
)
_CONFIG_VALIDATOR = jsonschema.Draft202012Validator(CONFIG_SCHEMA)


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


@dataclass(frozen=True)
class Upstream:
    url: str = "http://127.0.0.1:8000"
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


@dataclass(frozen=True)
class Client:
    """A client allowed through: its name (the tenant) and the sha256 of its key."""

    name: str
    key_sha256: str


@dataclass(frozen=True)
class Audit:
    path: str = "-"
    include_arguments: bool = False
    max_bytes: int | None = None


@dataclass(frozen=True)
class Ledger:
    backend: str = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    ttl_s: float = 86400.0
    max_responses: int = 25_000
    max_chain: int = 64
    timeout_s: float = 1.0
    fail_open: bool = False

    def __post_init__(self) -> None:
        if self.backend == "redis" and importlib.util.find_spec("redis") is None:
            raise ValueError(
                "backend: redis needs the redis client: pip install 'replay-proxy[redis]'"
            )


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024
    # A gated body must arrive whole this long after its head, or it is answered 408: the
    # proxy holds the body until it can judge it, so a client sending a byte a second would
    # hold a connection, a handler and a buffer for as long as it liked.
    body_timeout_s: float = 60.0


@dataclass(frozen=True)
class Config:
    listen: Listen = field(default_factory=Listen)
    upstream: Upstream = field(default_factory=Upstream)
    gate: Policy = field(default_factory=Policy)
    audit: Audit = field(default_factory=Audit)
    ledger: Ledger = field(default_factory=Ledger)
    limits: Limits = field(default_factory=Limits)
    clients: tuple[Client, ...] = ()

    def with_secrets(self, environ: Mapping[str, str]) -> Config:
        """The config with what it takes from the environment: `upstream.api_key` from the
        variable `api_key_env` names, and `upstream.proxy` (with `trust_env`) from the proxy
        variables."""
        upstream = self.upstream
        if upstream.trust_env:
            try:
                upstream = replace(upstream, proxy=proxy_for(upstream.url, environ))
            except ValueError as exc:
                raise ConfigError(f"upstream.trust_env: {exc}") from None
        name = upstream.api_key_env
        if name is not None:
            key = environ.get(name)
            if not key:
                raise ConfigError(
                    f"upstream.api_key_env: the environment variable {name} is not set"
                )
            if any((c < " " and c != "\t") or c == "\x7f" for c in key):
                # It goes into a header: a line break would let it write headers of its own.
                raise ConfigError(
                    f"upstream.api_key_env: the environment variable {name} holds a control "
                    "character (CR, LF, ...), which no header value may carry"
                )
            upstream = replace(upstream, api_key=key)
        return replace(self, upstream=upstream)

    def with_overrides(
        self, *, upstream: str | None = None, host: str | None = None, port: int | None = None
    ) -> Config:
        """The config with command-line flags applied over the file's values."""
        config = self
        try:
            if upstream is not None:
                config = replace(config, upstream=replace(config.upstream, url=upstream))
        except ValueError as exc:
            raise ConfigError(f"--upstream: {exc}") from None
        if host is not None:
            config = replace(config, listen=replace(config.listen, host=host))
        if port is not None:
            config = replace(config, listen=replace(config.listen, port=port))
        return config


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The forward proxy the environment names for `url`, as curl reads it: `<scheme>_proxy`
    then `ALL_PROXY` (lower case first), unless `NO_PROXY` lists the host (`*`, the host, or
    a domain it is in; a port, if given, must match). None for no proxy."""

    def variable(name: str) -> str:
        return (environ.get(name.lower()) or environ.get(name.upper()) or "").strip()

    parts = urlsplit(url)
    proxy = variable(f"{parts.scheme}_proxy") or variable("all_proxy")
    if not proxy:
        return None
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for entry in variable("no_proxy").split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return None
        name, _, entry_port = entry.removeprefix("[").partition("]:")
        if not entry_port and entry.count(":") == 1:
            name, _, entry_port = entry.partition(":")
        name = name.rstrip("]").lstrip(".")
        if entry_port and entry_port != str(port):
            continue
        if host == name or host.endswith("." + name):
            return None
    if "://" not in proxy:
        proxy = "http://" + proxy  # as curl reads a bare host:port
    if urlsplit(proxy).scheme not in ("http", "https"):
        raise ValueError(
            f"the proxy the environment names for {parts.scheme} is not an http(s) URL "
            "(false: the environment's proxy settings are ignored)"
        )
    return proxy


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
    """Read and validate a YAML config file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_config({} if data is None else data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_config(data: Any) -> Config:
    """Build a Config from parsed YAML; an unknown key or a bad value raises ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError("the config must be a mapping of sections")
    errors = sorted(_CONFIG_VALIDATOR.iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        raise ConfigError(_explain(errors[0]))
    sections: dict[str, Any] = {}
    for name, cls in (
        ("listen", Listen),
        ("upstream", Upstream),
        ("audit", Audit),
        ("ledger", Ledger),
        ("limits", Limits),
    ):
        try:
            sections[name] = cls(**data.get(name, {}))
        except ValueError as exc:
            raise ConfigError(f"{name}.{exc}") from None
    clients = tuple(Client(**c) for c in data.get("clients", ()))
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ConfigError("clients: two clients have the same name")
    if len({c.key_sha256 for c in clients}) != len(clients):
        raise ConfigError("clients: two clients have the same key")
    try:
        policy = Policy(**data.get("gate", {}), tools=data.get("tools", {}))
    except ValueError as exc:
        key = str(exc)
        raise ConfigError(key if key.startswith("tools.") else f"gate.{key}") from None
    return Config(gate=policy, clients=clients, **sections)


def _explain(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        # key=str: YAML keys need not be strings, and 1 < "a" would raise.
        unknown = sorted((k for k in error.instance if k not in known), key=str)
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        return f"{key}: unknown key"
    # A propertyNames failure reports the inner keyword (`enum`) with the property as instance.
    if "propertyNames" in error.relative_schema_path:
        return f"{where}.{error.instance}: unknown reason"
    return f"{where or 'config'}: {error.message}"
