"""The config in force: the settings sections and the gate's policy, frozen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from proxy.gate.policy import Policy
from proxy.settings import Audit, Client, ConfigError, Extproc, Ledger, Limits, Listen, Upstream


@dataclass(frozen=True)
class Config:
    listen: Listen = field(default_factory=Listen)
    upstream: Upstream = field(default_factory=Upstream)
    gate: Policy = field(default_factory=Policy)
    audit: Audit = field(default_factory=Audit)
    ledger: Ledger = field(default_factory=Ledger)
    limits: Limits = field(default_factory=Limits)
    clients: tuple[Client, ...] = ()
    extproc: Extproc = field(default_factory=Extproc)

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
