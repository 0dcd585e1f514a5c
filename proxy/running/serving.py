"""Serving the app: listening, reloading on SIGHUP, draining on SIGTERM."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import functools
import gc
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.config import Config
from proxy.running.config_review import describe
from proxy.server.app import make_admin_app, make_app
from proxy.server.keys import IN_FLIGHT, IN_FORCE, READINESS
from proxy.settings import AdminListen, ConfigError
from proxy.state.workers import WorkerSlot

log = logging.getLogger("replay_proxy")


async def serve(
    config: Config,
    *,
    reuse_port: bool = False,
    reload: Callable[[], Config] | None = None,
    worker: WorkerSlot | None = None,
    metrics_dir: str | None = None,
    workers: int = 1,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting and let requests in flight finish.

    SIGHUP calls `reload` for a new config and puts it in force for new requests. `worker` is
    the slot this process fills under a supervisor, told once this process listens;
    `metrics_dir` is the multiprocess directory of a worker's service (see `make_app`);
    `workers` how many processes serve it, as the start's summary says.
    """
    grace_s = config.listen.shutdown_grace_s
    on_glibc = return_large_buffers()
    trimming: asyncio.Task[None] | None = None
    app = make_app(config, worker, metrics_dir=metrics_dir)
    in_flight = InFlight(app[IN_FLIGHT])
    # The grace is kept by `InFlight.drain`; by the time the runner closes the connections no
    # handler is left, so its own wait (once for handlers, once more after cancelling) is short.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=_CLOSE_S)
    reloads: set[asyncio.Task[bool]] = set()
    admin: web.AppRunner | None = None
    try:
        # Inside the try: a start that fails half-way (the audit file) still closes what it
        # opened (the upstream pool) before the error is reported.
        await runner.setup()
        listen = config.listen
        try:
            tls = None if listen.tls is None else listen.tls.context()
        except ValueError as exc:  # a file changed since the config was read
            raise ConfigError(f"listen.tls.{exc}") from None
        site = web.TCPSite(runner, listen.host, listen.port, reuse_port=reuse_port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen(listen.host, listen.port, exc) from None
        port = _bound_port(runner)
        if config.admin.listen is not None:
            admin = await serve_admin(app, config.admin.listen, reuse_port=reuse_port)
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
        settle_heap()  # what start-up made is kept: the collector need not walk it again
        if on_glibc:
            trimming = asyncio.create_task(trim_heap_every(_TRIM_EVERY_S))
        # Said once its signals are handled: whoever waits for this line may stop it at once.
        log.info(
            "listening on %s://%s:%d, %s",
            listen.scheme,
            listen.host,
            port,
            _upstreams_said(config),
        )
        log.info("in force: %s", describe(config, workers))
        if admin is not None:
            assert config.admin.listen is not None
            log.info(
                "admin endpoints on http://%s:%d/-/", config.admin.listen.host, _bound_port(admin)
            )
        if worker is not None:
            worker.announce()  # once it listens and its signals are handled
        await stop.wait()
        # Readiness says so from now on: on the admin listener, which stays open through the
        # drain, and on the connections already open to this one.
        app[READINESS].draining = True
        log.info(
            "stopping: no new connections, %g s for %d request(s) in flight",
            grace_s,
            len(in_flight.tasks),
        )
        for listening in runner.sites:
            await listening.stop()
        cut = await in_flight.drain(grace_s)
        if cut:
            log.warning("%d request(s) still in flight after %g s: cut", cut, grace_s)
    finally:
        if trimming is not None:
            trimming.cancel()
        await asyncio.gather(*reloads, *([trimming] if trimming else []), return_exceptions=True)
        if admin is not None:
            await admin.cleanup()
        await runner.cleanup()
    log.info("stopped")


async def serve_admin(
    app: web.Application, listen: AdminListen, *, reuse_port: bool
) -> web.AppRunner:
    """Serve the admin endpoints of the started `app` on their own listener."""
    runner = web.AppRunner(
        make_admin_app(app), handle_signals=False, access_log=None, shutdown_timeout=_CLOSE_S
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, listen.host, listen.port, reuse_port=reuse_port).start()
    except OSError as exc:
        await runner.cleanup()
        raise cannot_listen(listen.host, listen.port, exc, "admin.listen.") from None
    return runner


# After the grace, a cancelled handler has this long to end, and the runner this long (twice)
# to close each connection: a stop takes at most `shutdown_grace_s` + 2 s
# (docs/configuration.md, "Stopping").
_CANCEL_S = 1.0
_CLOSE_S = 0.5


class InFlight:
    """The handlers running now, so that a stop can wait for them up to the grace, then cancel
    them (aiohttp's own shutdown waits its timeout twice and leaves a handler that waits on
    the upstream running through both)."""

    def __init__(self, tasks: set[asyncio.Task[Any]]) -> None:
        self.tasks = tasks  # the app's, kept by its `observe`

    async def drain(self, grace_s: float) -> int:
        """Wait up to `grace_s` for the handlers in flight; cancel those left. How many were."""
        if not self.tasks:
            return 0
        _, pending = await asyncio.wait(set(self.tasks), timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_CANCEL_S)
        return len(pending)


def cannot_listen(host: str, port: int, exc: OSError, section: str = "listen.") -> ConfigError:
    """A failed bind as the config key at fault: the port (in use, privileged) or the host (no
    such address here, a name that does not resolve)."""
    key = section + ("port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "host")
    # asyncio's own message repeats the address; the system's says only what went wrong.
    known = exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
    reason = os.strerror(exc.errno) if known and exc.errno else exc.strerror or str(exc)
    return ConfigError(f"{key}: cannot listen on {host}:{port}: {reason}")


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (it has mallopt and malloc_trim)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


# glibc's mallopt(M_MMAP_THRESHOLD, ...): a fixed threshold, which also ends its adjustment;
# M_TRIM_THRESHOLD: how much free memory at the heap's top is kept rather than given back.
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1

# Just above asyncio's read buffer: every read of a socket allocates 256 KiB (then shrinks it
# to what arrived), and with a threshold below that each read was an mmap, an mremap and a
# munmap, and their page faults (some 20-25 % of a small request's CPU under load).
_MMAP_FROM = 272 * 1024
_TRIM_FROM = 2 * _MMAP_FROM  # glibc's own rule when it adjusts the threshold


def return_large_buffers() -> bool:
    """Allocate buffers of more than 272 KiB (large bodies and answers) with mmap, so that
    freeing one gives its memory back to the system; smaller ones come from the heap.

    By default glibc raises that threshold each time such a buffer is freed, after which 1 MB
    bodies come from the heap, where they fragment it and keep the process's RSS high long
    after the request (on the load benchmark's 1 MB bodies: peak RSS 121 -> 96 MB, and 98 ->
    59 MB once small requests follow). The threshold sits above the 256 KiB that asyncio
    allocates for each read of a socket, which would otherwise be mapped and unmapped at every
    read. Elsewhere than glibc this does nothing.
    """
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_FROM)
    )


# How often the heap's free pages are given back (`trim_heap_every`).
_TRIM_EVERY_S = 10.0


def give_back_free_memory() -> bool:
    """Give the system back the free pages of the heap, those between blocks in use too
    (glibc's malloc_trim). Elsewhere than glibc this does nothing."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


async def trim_heap_every(
    period_s: float, trim: Callable[[], object] = give_back_free_memory
) -> None:
    """Trim the heap every `period_s` until cancelled.

    Buffers below the mmap threshold (a socket read's 256 KiB, a large body's chunks) come
    from the heap, and after a burst of large bodies the free space they leave between blocks
    in use stays in the process's RSS (after the load benchmark's 1 MB bodies: 81 MB untrimmed,
    74 MB trimmed every 10 s, 55 MB trimmed every second but with the pages taken back at
    some 150 more faults per 1 MB request). A trim takes well under a millisecond.
    """
    while True:
        await asyncio.sleep(period_s)
        trim()


# Net allocations between two young collections (CPython's default: 700).
_YOUNG_COLLECTION = 10_000


def settle_heap() -> None:
    """Keep the collector off what start-up made and the process keeps (modules, the config,
    its compiled schemas, the upstream pools), and let it run less often on the young.

    Under load the collector took some 50-80 µs of CPU per request: full passes walked the
    start-up heap every few thousand requests, and a young pass ran every ~10 requests. Frozen,
    the start-up heap is never walked again; a request's own objects are freed by their counts
    long before 10,000 net allocations, so the young passes find little either way.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION, middle, old)


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the server is not bound to a TCP port")


def _upstreams_said(config: Config) -> str:
    """The upstreams, as the start's log line names them."""
    if not config.upstreams:
        return f"upstream {config.upstream.url}"
    named = ", ".join(f"{name}={u.url}" for name, u in config.upstreams.items())
    return f"upstreams {named}"
