"""A lean HTTP/1.1 client for the upstream hop: keep-alive connections to one origin, answers
parsed by llhttp (httptools) and handed over chunk by chunk.

aiohttp's client costs more per request than the whole gate (request and response objects,
timers, tracing hooks, cookie and redirect machinery, all unused by a proxy); this one does
what the hop needs and nothing else. WebSocket upgrades still go through aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Collection
from typing import Final

import httptools
from multidict import CIMultiDict
from yarl import URL

# Buffered answer bytes above which the upstream connection stops being read (a slow client).
_HIGH_WATER: Final = 256 * 1024
# Methods whose request carries `Content-Length: 0` when it has no body (as clients send).
_BODYLESS: Final = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE", "CONNECT"})
_IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# An idle pooled connection older than this is closed rather than reused (servers drop them).
IDLE_S: Final = 15.0


class ConnectError(Exception):
    """No connection could be opened to the upstream."""


class BrokenAnswer(Exception):
    """The upstream closed or reset the connection before the answer was whole."""


class BadAnswer(Exception):
    """The upstream's bytes are not an HTTP/1.x answer."""


class _Connection(asyncio.Protocol):
    """One connection to the upstream, carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._drain: asyncio.Future[None] | None = None
        self.writing_paused = False
        self.lost = False
        self.complete = False
        self.head_only = False
        self.begin(head_only=False)

    def begin(self, *, head_only: bool) -> None:
        """Ready for the answer to a new request (`head_only`: to a HEAD request)."""
        self.received = 0
        if head_only or not self.reusable() or self.head_only:
            # A parser that read a whole answer is ready for the next one; any other is not.
            self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.status = 0
        self.reason = bytearray()
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # Content-Length or chunked: EOF before the end is a truncation
        self.interim = False  # a 1xx answer, to be skipped
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.reading_paused = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.complete or self.error is not None:
            # Bytes nobody asked for (after an answer to HEAD, or a second answer): the
            # connection can no longer be trusted to frame the next one.
            self.keep_alive = False
            self.close()
            return
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadAnswer("the upstream switched protocols on a plain request"))
        except httptools.HttpParserError as exc:
            self._fail(BadAnswer(str(exc) or type(exc).__name__))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost decides what the EOF means

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            if self.head_done and not self.framed:
                # The answer is delimited by the end of the connection (RFC 9112 §6.3).
                self.complete = True
            else:
                reason = f": {exc}" if exc is not None else ""
                where = "mid-answer" if self.head_done else "before answering"
                self.error = BrokenAnswer(f"the upstream closed the connection {where}{reason}")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # httptools callbacks

    # After the head is done, a status or header belongs to a second answer: dropped, and
    # on_headers_complete marks the connection spent.

    def on_status(self, status: bytes) -> None:
        if not self.head_done:
            self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:
            self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            self.keep_alive = False  # a second answer to one request
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.interim = True
            self.reason.clear()
            self.raw_headers.clear()
            return
        self.status = status
        for name, value in self.raw_headers:
            lower = name.lower()
            if lower == b"content-length" or (
                lower == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                self.framed = True
        self.head_done = True
        if self.head_only:
            self.complete = True
            self.keep_alive = False  # llhttp would wait for the body a HEAD answer announces
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.complete:
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # used by Pool and Answer

    def _fail(self, error: Exception) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until the parser has more to say, or TimeoutError after `timeout_s` of silence."""
        waiter = self.loop.create_future()
        self.waiter = waiter
        timer = self.loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    async def drain(self) -> None:
        if self.writing_paused and not self.lost:
            self._drain = self.loop.create_future()
            await self._drain
        if self.lost:
            raise BrokenAnswer("the upstream closed the connection while the request was sent")

    def take(self) -> bytes:
        """Every buffered body byte, and the upstream is read on."""
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return data

    def open(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost and self.error is None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _replayable(
    method: str, headers: Collection[tuple[str, str]], body: bytes | AsyncIterable[bytes] | None
) -> bool:
    if not (body is None or isinstance(body, bytes)):
        return False  # a streamed body was consumed
    return method in _IDEMPOTENT or any(name.lower() == "idempotency-key" for name, _ in headers)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Answer:
    """The head of an upstream answer, and its body to be read with `chunks()` once."""

    def __init__(self, pool: Pool, connection: _Connection) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self.status = connection.status
        self.reason = connection.reason.decode("latin-1")
        self.headers: CIMultiDict[str] = CIMultiDict(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in connection.raw_headers
        )
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None

    @property
    def arrived(self) -> bool:
        """Whether the body (or its first part) came with the head."""
        connection = self._connection
        return connection is not None and (bool(connection.chunks) or connection.complete)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises BrokenAnswer, BadAnswer or TimeoutError mid-answer."""
        connection = self._connection
        assert connection is not None, "the answer was released"
        while True:
            if connection.chunks:
                yield connection.take()
            elif connection.complete:
                return
            elif connection.error is not None:
                raise connection.error
            else:
                await connection.wait(self._pool.read_timeout_s)

    def release(self) -> None:
        """The connection goes back to the pool if the answer was read whole, else is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.put(connection)


class Pool:
    """Keep-alive connections to one origin; unbounded, idle ones reused last-in first-out."""

    def __init__(self, base: URL, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        if base.scheme not in ("http", "https") or base.host is None:
            raise ValueError(f"not an http(s) URL with a host: {base}")
        self.host = base.host
        self.port = base.port or (443 if base.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if base.scheme == "https" else None
        self.prefix = base.raw_path.rstrip("/")
        self.authority = base.host_port_subcomponent or self.host
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        # Idle connections, most recently used on the right: reused from the right, and
        # expired from the left, where the ones that have waited longest are.
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        target: str,
        headers: Collection[tuple[str, str]],
        body: bytes | AsyncIterable[bytes] | None,
        *,
        length: int | None = None,
    ) -> Answer:
        """Send a request and wait for the head of its answer.

        `target` is the path and query as the client sent them (still encoded); `headers` are
        sent as they are, after `Host` and before the body's own framing header. A streamed
        `body` of known `length` goes with Content-Length, else chunked.

        A kept-alive connection the upstream closed without a byte of answer is retried once
        on a new one, if the request can be sent again without effect (RFC 9110 §9.2.2).
        """
        head = self._head(method, target, headers, body, length)
        connection, reused = await self._connection()
        try:
            return await self._exchange(connection, method, head, body, length)
        except BrokenAnswer:
            if not (reused and connection.received == 0 and _replayable(method, headers, body)):
                raise
        connection, _ = await self._connection(fresh=True)
        return await self._exchange(connection, method, head, body, length)

    def _head(
        self,
        method: str,
        target: str,
        headers: Collection[tuple[str, str]],
        body: bytes | AsyncIterable[bytes] | None,
        length: int | None,
    ) -> bytes:
        head = [f"{method} {self.prefix}{target} HTTP/1.1\r\nHost: {self.authority}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in headers)
        if isinstance(body, bytes):
            head.append(f"Content-Length: {len(body)}\r\n\r\n")
        elif body is not None and length is not None:
            head.append(f"Content-Length: {length}\r\n\r\n")
        elif body is not None:
            head.append("Transfer-Encoding: chunked\r\n\r\n")
        elif method not in _BODYLESS:
            head.append("Content-Length: 0\r\n\r\n")
        else:
            head.append("\r\n")
        return "".join(head).encode("latin-1")

    async def _exchange(
        self,
        connection: _Connection,
        method: str,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        length: int | None,
    ) -> Answer:
        try:
            connection.begin(head_only=method == "HEAD")
            chunked = body is not None and not isinstance(body, bytes) and length is None
            await self._send(connection, head, body, chunked)
            while not connection.head_done:
                if connection.error is not None:
                    raise connection.error
                await connection.wait(self.read_timeout_s)
        except BaseException:
            self._discard(connection)
            raise
        return Answer(self, connection)

    async def _send(
        self,
        connection: _Connection,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        chunked: bool,
    ) -> None:
        transport = connection.transport
        assert transport is not None
        if isinstance(body, bytes):
            if len(body) <= 64 * 1024:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            await self._drained(connection)
            return
        transport.write(head)
        if body is None:
            return
        async for chunk in body:
            if connection.lost:
                break
            if not chunk:
                continue
            if chunked:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            else:
                transport.write(chunk)
            await self._drained(connection)
        if chunked and not connection.lost:
            transport.write(b"0\r\n\r\n")
        await self._drained(connection)

    @staticmethod
    async def _drained(connection: _Connection) -> None:
        try:
            await connection.drain()
        except BrokenAnswer:
            if not connection.head_done:
                raise  # else the upstream answered early: that answer is relayed

    async def _connection(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection, and whether it was reused; `fresh` for a new one."""
        now = time.monotonic()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.open() and now - connection.idle_since < IDLE_S:
                return connection, True
            self._discard(connection)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from None
        self._open.add(connection)
        return connection, False

    def put(self, connection: _Connection) -> None:
        now = time.monotonic()
        if connection.reusable():
            connection.idle_since = now
            self._idle.append(connection)
        else:
            self._discard(connection)
        # Connections idle too long, or closed by the upstream meanwhile, are let go of here
        # too: a pool that grew for a burst does not keep its sockets open until the next one.
        idle = self._idle
        while idle and (not idle[0].open() or now - idle[0].idle_since >= IDLE_S):
            self._discard(idle.popleft())

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    @property
    def idle(self) -> int:
        """How many connections wait in the pool to be reused."""
        return len(self._idle)

    def close(self) -> None:
        """Close every connection, idle or in use."""
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
