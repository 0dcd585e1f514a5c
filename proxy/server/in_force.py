"""The config in force and the upstream it names, swapped whole on reload."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.config import Config
from proxy.gate.caches import GateCaches
from proxy.server.upstream import Upstream
from proxy.settings import ConfigError

log = logging.getLogger("replay_proxy")


@dataclass(frozen=True)
class InForce:
    """The config in force, the upstream it names, and what the gate learns under its policy
    (compiled request schemas, verdicts); replaced whole on reload, so a new policy starts
    with empty caches."""

    config: Config
    upstream: Upstream
    caches: GateCaches = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "caches", GateCaches.for_policy(self.config.gate))


class InForceHolder:
    """Holds the `InForce` pair; a request reads it once, so a reload never splits a request."""

    def __init__(self, on_reload: Callable[[bool], None] | None = None) -> None:
        self._current: InForce | None = None
        self.on_reload = on_reload  # told whether each reload was applied

    @property
    def current(self) -> InForce:
        assert self._current is not None, "InForceHolder.start() was not awaited"
        return self._current

    async def start(self, config: Config) -> None:
        upstream = Upstream(config.upstream)
        await upstream.start()
        self._current = InForce(config, upstream)

    async def swap(self, config: Config) -> None:
        """Put a new config in force for new requests; requests in flight keep theirs."""
        old = self.current
        upstream = old.upstream
        if config.upstream != old.config.upstream:
            upstream = Upstream(config.upstream)
            await upstream.start()
        for section in ("listen", "ledger", "audit", "admin", "log", "tracing"):
            if getattr(config, section) != getattr(old.config, section):
                log.warning("config reload: %s changed; it takes effect on restart", section)
        self._current = InForce(config, upstream)
        if upstream is not old.upstream:
            # Requests in flight finish on the old pool, which closes after the last of them.
            await old.upstream.retire()

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
        await self.current.upstream.close()
