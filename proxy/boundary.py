"""What every transport shares: the live config, who the client is, and judging a body."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy import audit, body
from proxy.audit import AuditLog
from proxy.config import Config, ConfigError
from proxy.gate import (
    NOTHING_RECORDED,
    Verdict,
    compile_schemas,
    inspect,
    pending_schemas,
    rejection,
)
from proxy.ledger import Ledger
from proxy.metrics import Metrics
from proxy.upstream import Upstream, UpstreamError, relayed_headers

log = logging.getLogger("replay_proxy")

# Credentials a client presents; when the proxy authenticates clients or holds the upstream
# key itself, they are the proxy's, and never go upstream.
_CREDENTIALS = frozenset({"authorization", "api-key"})


@dataclass(frozen=True)
class Current:
    """The config in force and the upstream it names; replaced whole on reload."""

    config: Config
    upstream: Upstream


class Live:
    """Holds the `Current` state; a request reads it once, so a reload never splits a request."""

    def __init__(self) -> None:
        self._current: Current | None = None

    @property
    def current(self) -> Current:
        assert self._current is not None, "Live.start() was not awaited"
        return self._current

    async def start(self, config: Config) -> None:
        upstream = Upstream(config.upstream)
        await upstream.start()
        self._current = Current(config, upstream)

    async def swap(self, config: Config) -> None:
        """Put a new config in force for new requests; requests in flight keep theirs."""
        old = self.current
        upstream = old.upstream
        if config.upstream != old.config.upstream:
            upstream = Upstream(config.upstream)
            await upstream.start()
        for section in ("listen", "ledger", "audit"):
            if getattr(config, section) != getattr(old.config, section):
                log.warning("config reload: %s changed; it takes effect on restart", section)
        self._current = Current(config, upstream)
        if upstream is not old.upstream:
            # Requests in flight finish on the old pool, which closes after the last of them.
            await old.upstream.retire()

    async def reload(self, load: Callable[[], Config]) -> bool:
        """Re-read the config; an invalid one is logged and the old one stays in force."""
        try:
            config = load()
        except ConfigError as exc:
            log.error("config reload rejected, the old config stays: %s", exc)
            return False
        await self.swap(config)
        log.info("config reloaded")
        return True

    async def close(self) -> None:
        await self.current.upstream.close()


LIVE = web.AppKey("live", Live)
AUDIT = web.AppKey("audit", AuditLog)
METRICS = web.AppKey("metrics", Metrics)
LEDGER = web.AppKey("ledger", Ledger)
# The proxy's own id of a request: its `x-request-id`, its audit record's `request_id`, and the
# first word of every log line about it.
REQUEST_ID = web.RequestKey("request_id", str)


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


class Unauthorized(Exception):
    """The request names no client the config lets through."""


def tenant_of(headers: CIMultiDictProxy[str], config: Config) -> str | None:
    """The tenant a request acts for: the name of its client when the config lists clients
    (raises Unauthorized without a listed key), else a fingerprint of its credential."""
    credential = headers.get("Authorization") or headers.get("api-key")
    if not config.clients:
        return audit.tenant_of(credential)
    key = credential or ""
    if key[:7].lower() == "bearer ":
        key = key[7:].strip()
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    found = None
    for client in config.clients:
        # Every entry is compared, in constant time, whatever matches.
        if hmac.compare_digest(digest, client.key_sha256) and key:
            found = client.name
    if found is None:
        raise Unauthorized
    return found


def unauthorized() -> web.Response:
    return error_response(
        401,
        "invalid_api_key",
        "a valid API key for this proxy is required",
        headers={"WWW-Authenticate": "Bearer"},
        type_="authentication_error",
    )


def upstream_headers(
    headers: CIMultiDictProxy[str], config: Config, drop: frozenset[str]
) -> CIMultiDict[str]:
    """The client's headers as the upstream sees them, with the proxy's key if it holds one."""
    own_credentials = config.clients or config.upstream.api_key is not None
    out = relayed_headers(headers, drop=(drop | _CREDENTIALS) if own_credentials else drop)
    if config.upstream.api_key is not None:
        out["Authorization"] = f"Bearer {config.upstream.api_key}"
    return out


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    type_: str | None = None,
) -> web.Response:
    """Every answer the proxy makes itself: the API's `{"error": {...}}` shape, typed
    `server_error` for a 5xx (the spec's mapping) unless `type_` says otherwise."""
    if type_ is None:
        type_ = "server_error" if status >= 500 else "invalid_request_error"
    return web.Response(
        status=status,
        body=orjson.dumps(body.error_body(code, message, type_=type_)),
        content_type="application/json",
        headers=headers,
    )


def upstream_failed(request_id: str, what: str, exc: UpstreamError) -> web.Response:
    """The answer to a request no upstream answer could be had for. Its message names the
    failure only; the detail (an address, a socket error) goes to the log."""
    log.warning("%s %s: %s: %s", request_id, what, exc.code, exc.detail)
    return error_response(exc.status, exc.code, exc.message)


def blocked(verdict: Verdict, request_id: str) -> dict[str, Any]:
    """The error body of a blocked request, naming its audit record's `request_id`."""
    answer = rejection(verdict)
    answer["error"]["request_id"] = request_id
    return answer


async def judge(
    app: web.Application,
    config: Config,
    parsed: dict[str, Any],
    raw: bytes,
    *,
    request_id: str,
    path: str,
    tenant: str | None,
    transport: str,
) -> Verdict:
    """Gate a parsed body against its recorded history; count and audit what it finds."""
    view = await app[LEDGER].view(tenant or "-", parsed, provenance=config.gate.require_provenance)
    pending = pending_schemas(parsed, config.gate)
    if pending:
        # A schema first seen is compiled in a worker thread: a large one (thousands of
        # subschemas, within the limits) must not hold every other client's request.
        await asyncio.to_thread(compile_schemas, pending, config.gate)
    verdict = inspect(parsed, config.gate, view or NOTHING_RECORDED)
    if verdict.findings:
        for finding in verdict.findings:
            app[METRICS].findings.labels(finding.reason, finding.action).inc()
        app[AUDIT].write(
            audit.Request(
                request_id=request_id,
                transport=transport,
                path=path,
                body=parsed,
                raw=raw,
                tenant=tenant,
            ),
            verdict,
        )
    return verdict
