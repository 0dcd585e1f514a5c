"""Serving the External Processor: `replay-proxy extproc`, a gRPC server for Envoy's ext_proc
filter, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import grpc

from proxy.config import Config
from proxy.extproc.service import add_to, open_front
from proxy.settings import ConfigError, UpstreamSettings

log = logging.getLogger("replay_proxy")


def ignored_sections(config: Config) -> list[str]:
    """What the config sets that `serve` uses and a processor behind Envoy does not."""
    ignored = []
    if config.upstream != UpstreamSettings():
        ignored.append(
            "upstream: is set, but behind Envoy the upstream is Envoy's business (its route "
            "and cluster); replay-proxy extproc ignores it"
        )
    return ignored


async def serve_extproc(config: Config, listen: str, metrics_dir: str | None = None) -> None:
    """Serve Envoy's streams on `listen` (`HOST:PORT` or `unix:PATH`) until SIGTERM or SIGINT,
    then let the streams in flight finish within `listen.shutdown_grace_s`. The counters go to
    `metrics_dir` (a multiprocess directory) when one is given."""
    for warning in ignored_sections(config):
        log.warning("%s", warning)
    async with open_front(config, metrics_dir) as front:
        # Without SO_REUSEPORT (gRPC's default is to set it): a port in use is an error, not
        # a port silently shared with another process.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        add_to(server, front)
        try:
            port = server.add_insecure_port(listen)
        except RuntimeError as exc:
            reason = str(exc).split(";")[0]  # without gRPC's advice to set GRPC_VERBOSITY
            raise ConfigError(f"extproc.listen: cannot listen on {listen}: {reason}") from None
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        # Said once SIGTERM stops it cleanly: whoever waits for this line may stop it at once.
        shown = listen if listen.startswith("unix:") else f"{listen.rpartition(':')[0]}:{port}"
        log.info("ext_proc listening on %s", shown)
        # In multiprocess mode, this process's figures are written where a scrape reads them.
        process = front.metrics.process
        refreshed = None if process is None else asyncio.create_task(process.keep_refreshed())
        try:
            await stop.wait()
        finally:
            log.info("stopping: %g s for the streams in flight", config.listen.shutdown_grace_s)
            await server.stop(config.listen.shutdown_grace_s)
            if refreshed is not None:
                refreshed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refreshed
    log.info("stopped")
