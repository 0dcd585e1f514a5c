"""The config in force and the upstreams it names, swapped whole on reload."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from proxy.admission.routing import RouteCaches
from proxy.config import Config
from proxy.server.upstream import Upstream
from proxy.settings import ConfigError

log = logging.getLogger("replay_proxy")


@dataclass(frozen=True)
class InForce:
    """The config in force, one `Upstream` (a client session) per upstream it names, and what
    the gate learns under each route's policy (compiled request schemas, verdicts); replaced
    whole on reload, so a new policy starts with empty caches."""

    config: Config
    upstreams: Mapping[str, Upstream]
    caches: RouteCaches = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "caches", RouteCaches(self.config))
        object.__setattr__(self, "upstreams", MappingProxyType(dict(self.upstreams)))

    @property
    def upstream(self) -> Upstream:
        """The upstream of the last route: the default one in most configs, and the only one
        of the single `upstream:` form."""
        return self.upstreams[self.config.routing[-1].upstream]

    def acquire(self) -> None:
        """A request starts: every upstream stays open until it is done (it may take any)."""
        for upstream in self.upstreams.values():
            upstream.acquire()

    def release(self) -> Awaitable[None] | None:
        """That request is done: what to await when it was the last one of an upstream a reload
        retired (whose pool closes then), else None (no coroutine on every request)."""
        idle = [upstream for upstream in self.upstreams.values() if upstream.leave()]
        return _closed(idle) if idle else None


class InForceHolder:
    """Holds the `InForce` in force; a request reads it once, so a reload never splits a
    request."""

    def __init__(self, on_reload: Callable[[bool], None] | None = None) -> None:
        self._current: InForce | None = None
        self.on_reload = on_reload  # told whether each reload was applied

    @property
    def current(self) -> InForce:
        assert self._current is not None, "InForceHolder.start() was not awaited"
        return self._current

    async def start(self, config: Config) -> None:
        self._current = InForce(config, await _started(config, {}))

    async def swap(self, config: Config) -> None:
        """Put a new config in force for new requests; requests in flight keep theirs."""
        old = self.current
        upstreams = await _started(config, old.upstreams)
        for section in ("listen", "ledger", "audit", "admin", "log", "tracing"):
            if getattr(config, section) != getattr(old.config, section):
                log.warning("config reload: %s changed; it takes effect on restart", section)
        self._current = InForce(config, upstreams)
        kept = {id(upstream) for upstream in upstreams.values()}
        for upstream in old.upstreams.values():
            if id(upstream) not in kept:
                # Requests in flight finish on the old pool, which closes after the last of them.
                await upstream.retire()

    async def reload(self, load: Callable[[], Config]) -> bool:
        """Re-read the config; an invalid one is logged and the old one stays in force."""
        try:
            config = load()
        except ConfigError as exc:
            log.error("config reload rejected, the old config stays: %s", exc)
            self._reloaded(applied=False)
            return False
        await self.swap(config)
        log.info("config reloaded")
        self._reloaded(applied=True)
        return True

    def _reloaded(self, *, applied: bool) -> None:
        if self.on_reload is not None:
            self.on_reload(applied)

    async def close(self) -> None:
        for upstream in self.current.upstreams.values():
            await upstream.close()


async def _closed(upstreams: list[Upstream]) -> None:
    for upstream in upstreams:
        await upstream.close()


async def _started(config: Config, running: Mapping[str, Upstream]) -> dict[str, Upstream]:
    """An upstream for each the config names (an MCP server's too): a running one whose
    settings did not change is kept (its pool with it), the others are started."""
    found: dict[str, Upstream] = {}
    named = {**config.upstream_named, **config.mcp_upstreams}
    for name, settings in named.items():
        old = running.get(name)
        if old is not None and old.settings == settings:
            found[name] = old
            continue
        upstream = Upstream(settings, name)
        await upstream.start()
        found[name] = upstream
    return found
