"""The config in force: the settings sections and the gate's policy, frozen."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import urlsplit

from proxy.gate.policy import Policy
from proxy.settings import (
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
    ReadinessSettings,
    TracingSettings,
    UpstreamSettings,
)

# The one upstream of the single `upstream:` form, by name (audit records, metrics, the ledger).
DEFAULT_UPSTREAM = "default"
# The upstream an MCP server is, by its name: `mcp:<name>` (a name of `upstreams:` has no `:`).
MCP_UPSTREAM = "mcp:"

# A path prefix is plain segments: it is matched against the normalised path, which has no
# other characters unescaped that a reading could change.
_PREFIX = re.compile(r"(?:/[A-Za-z0-9._~!$&'()*+,=:@-]+)+")


@dataclass(frozen=True)
class Route:
    """One entry of `routes:`: what it matches (all of its matchers must; none: every
    request), the upstream it sends to, and the gate's policy on it.

    `gate` is the policy in force on this route: the top-level `gate:` with the route's own
    overrides, and the upstream's vendor.
    """

    upstream: str
    path_prefix: str | None = None  # a request under it goes upstream without it
    model: str | None = None  # the body's `model`, exactly or as a glob (`acme/*`)
    strip_model_prefix: bool = False  # `acme/big` goes upstream as `big`
    header: tuple[str, str] | None = None  # (name, lower case; value, exact)
    materialize: bool = False  # inline a previous response recorded from another upstream
    gate: Policy = field(default_factory=Policy)

    def __post_init__(self) -> None:
        prefix = self.path_prefix
        if prefix is not None:
            if not _PREFIX.fullmatch(prefix) or any(
                segment in (".", "..") for segment in prefix.split("/")
            ):
                raise ValueError(
                    f"path_prefix: {prefix!r} is not a path of plain segments like /acme "
                    "(no trailing slash, no dot segments, no escapes)"
                )
            if prefix.split("/")[1] == "-":
                raise ValueError(f"path_prefix: {prefix!r} is under /-/, the proxy's own paths")
        if self.strip_model_prefix and self.model is None:
            raise ValueError("strip_model_prefix: only a route that matches a model strips it")
        if self.header is not None:
            name, value = self.header
            object.__setattr__(self, "header", (name.lower(), value))


@dataclass(frozen=True)
class Config:
    listen: Listen = field(default_factory=Listen)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    gate: Policy = field(default_factory=Policy)
    audit: Audit = field(default_factory=Audit)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    limits: Limits = field(default_factory=Limits)
    clients: tuple[Client, ...] = ()
    # Tenant fingerprint (`t_...`, as in the audit log) -> a name, for `audit report`.
    tenants: Mapping[str, str] = field(default_factory=dict)
    admin: Admin = field(default_factory=Admin)
    log: Log = field(default_factory=Log)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    # The `upstreams:` form: each provider by name, and the routes between them. Empty: the
    # single `upstream:` is one upstream named `default` and one route to it.
    upstreams: Mapping[str, UpstreamSettings] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    # `upstreams`, or `upstream` as `default`; and `routes`, or the one route to it.
    upstream_named: Mapping[str, UpstreamSettings] = field(init=False, compare=False, repr=False)
    routing: tuple[Route, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.upstreams:
            named: Mapping[str, UpstreamSettings] = MappingProxyType(dict(self.upstreams))
            routing = self.routes
        else:
            named = MappingProxyType({DEFAULT_UPSTREAM: self.upstream})
            routing = self.routes or (Route(DEFAULT_UPSTREAM, gate=self.gate),)
        for index, route in enumerate(routing):
            if route.upstream not in named:
                raise ConfigError(
                    f"routes[{index}].upstream: {route.upstream!r} is not an upstream "
                    f"({', '.join(named)})"
                )
        object.__setattr__(self, "upstream_named", named)
        object.__setattr__(self, "routing", routing)
        servers = self.mcp.servers
        if servers:
            mcp_gate = replace(
                self.gate, action=self.mcp.action, actions={}, require_provenance=False
            )
            mcp_routes = {name: Route(MCP_UPSTREAM + name, gate=mcp_gate) for name in servers}
        else:
            mcp_routes = {}
        object.__setattr__(self, "mcp_routes", MappingProxyType(mcp_routes))

    extproc: Extproc = field(default_factory=Extproc)
    readiness: ReadinessSettings = field(default_factory=ReadinessSettings)
    mcp: Mcp = field(default_factory=Mcp)
    # Each MCP server's route, by its name: its upstream (`mcp:<name>`), and the top-level gate
    # with `mcp.action` for every reason (a tools/call has no replayed provenance to ask for).
    mcp_routes: Mapping[str, Route] = field(init=False, compare=False, repr=False)

    @property
    def mcp_upstreams(self) -> Mapping[str, UpstreamSettings]:
        """The upstream of each MCP server, by its route's upstream name."""
        return {MCP_UPSTREAM + name: s.upstream for name, s in self.mcp.servers.items()}

    def with_secrets(self, environ: Mapping[str, str]) -> Config:
        """The config with what it takes from the environment: each upstream's `api_key` from
        the variable its `api_key_env` names, and its `proxy` (with `trust_env`) from the proxy
        variables."""
        config = self
        if self.mcp.servers:
            servers = {
                name: replace(
                    server,
                    upstream=_with_secrets(server.upstream, environ, f"mcp.servers.{name}"),
                )
                for name, server in self.mcp.servers.items()
            }
            config = replace(self, mcp=replace(self.mcp, servers=servers))
        if not self.upstreams:
            return replace(config, upstream=_with_secrets(self.upstream, environ, "upstream"))
        upstreams = {
            name: _with_secrets(upstream, environ, f"upstreams.{name}")
            for name, upstream in self.upstreams.items()
        }
        return replace(config, upstreams=upstreams)

    def with_overrides(
        self, *, upstream: str | None = None, host: str | None = None, port: int | None = None
    ) -> Config:
        """The config with command-line flags applied over the file's values."""
        config = self
        if upstream is not None and config.upstreams:
            raise ConfigError(
                "--upstream: the config names its upstreams (upstreams:); change the file"
            )
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


def _with_secrets(
    upstream: UpstreamSettings, environ: Mapping[str, str], key: str
) -> UpstreamSettings:
    """One upstream with its forward proxy and its key from the environment; `key` is where
    the config names it, for the errors."""
    if upstream.trust_env:
        try:
            upstream = replace(upstream, proxy=proxy_for(upstream.url, environ))
        except ValueError as exc:
            raise ConfigError(f"{key}.trust_env: {exc}") from None
    name = upstream.api_key_env
    if name is not None:
        value = environ.get(name)
        if not value:
            raise ConfigError(f"{key}.api_key_env: the environment variable {name} is not set")
        if any((c < " " and c != "\t") or c == "\x7f" for c in value):
            # It goes into a header: a line break would let it write headers of its own.
            raise ConfigError(
                f"{key}.api_key_env: the environment variable {name} holds a control "
                "character (CR, LF, ...), which no header value may carry"
            )
        upstream = replace(upstream, api_key=value)
    return upstream


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
