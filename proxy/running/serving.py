"""Serving the app: listening, reloading on SIGHUP, draining on SIGTERM."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from proxy.config import Config
from proxy.server.app import make_app
from proxy.server.keys import IN_FORCE

log = logging.getLogger("replay_proxy")


async def serve(
    config: Config,
    *,
    reuse_port: bool = False,
    reload: Callable[[], Config] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting and let requests in flight finish.

    SIGHUP calls `reload` for a new config and puts it in force for new requests.
    """
    grace_s = config.listen.shutdown_grace_s
    return_large_buffers()
    app = make_app(config)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=grace_s)
    await runner.setup()
    reloads: set[asyncio.Task[bool]] = set()
    try:
        site = web.TCPSite(runner, config.listen.host, config.listen.port, reuse_port=reuse_port)
        await site.start()
        port = _bound_port(runner)
        log.info(
            "listening on http://%s:%d, upstream %s", config.listen.host, port, config.upstream.url
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if reload is not None:
            load = reload

            def on_hangup() -> None:
                task = asyncio.create_task(app[IN_FORCE].reload(load))
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(signal.SIGHUP, on_hangup)
        await stop.wait()
        log.info("stopping: no new connections, %.0f s for requests in flight", grace_s)
    finally:
        await asyncio.gather(*reloads, return_exceptions=True)
        await runner.cleanup()


# glibc's mallopt(M_MMAP_THRESHOLD, ...): a fixed threshold, which also ends its adjustment.
_M_MMAP_THRESHOLD = -3

_MMAP_FROM = 128 * 1024


def return_large_buffers() -> bool:
    """Allocate buffers of 128 KiB and more (bodies, answers) with mmap, so that freeing one
    gives its memory back to the system.

    By default glibc raises that threshold each time such a buffer is freed, after which 1 MB
    bodies come from the heap, where they fragment it and keep the process's RSS high long
    after the request (on the load benchmark's 1 MB bodies: peak RSS 121 -> 96 MB, and 98 ->
    59 MB once small requests follow). Elsewhere than glibc this does nothing.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM))


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the server is not bound to a TCP port")
