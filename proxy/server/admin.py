"""The admin endpoints under `/-/`: readiness, and who may call them on which listener."""

from __future__ import annotations

import functools

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.gate.errors import ProxyError
from proxy.server.clients import tenant_of
from proxy.server.keys import IN_FORCE, READINESS, SERVICES
from proxy.server.readiness import Check, is_ready


def guarded(handler: Handler) -> Handler:
    """`handler` of an admin endpoint as the data listener serves it: with `admin.listen` set,
    no admin endpoint is served there (404); with `clients:` set, an admin endpoint wants a
    client's key like any other path (401). Around the admin handlers only, not a middleware:
    a request to any other path pays nothing for it."""

    @functools.wraps(handler)
    async def guarded_handler(request: web.Request) -> web.StreamResponse:
        config = request.app[IN_FORCE].current.config
        if config.admin.listen is not None:
            raise ProxyError(
                404,
                "not_found",
                f"{request.method} {request.path}: admin endpoints are served on their own "
                "listener (admin.listen), not here",
            )
        if config.clients:
            tenant_of(request.headers, config)  # a 401 without a listed key
        return await handler(request)

    return guarded_handler


async def check_readiness(app: web.Application) -> list[Check]:
    """Every readiness check against the config in force (which sets the readiness gauges)."""
    return await app[READINESS].checks(app[IN_FORCE].current.config, app[SERVICES].ledger.store)


async def ready(request: web.Request) -> web.Response:
    """200 when every check readiness depends on holds, else 503; the body lists every check."""
    checks = await check_readiness(request.app)
    ok = is_ready(checks)
    return web.json_response(
        {"status": "ready" if ok else "not_ready", "checks": [c.as_dict() for c in checks]},
        status=200 if ok else 503,
    )


async def not_admin(request: web.Request) -> web.StreamResponse:
    """The admin listener serves the admin endpoints and nothing else."""
    raise ProxyError(
        404, "not_found", f"{request.method} {request.path}: the admin listener serves only /-/"
    )
