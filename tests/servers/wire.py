"""Raw-socket doubles on 127.0.0.1, for the bytes a real client or server would not produce:
upstreams that answer from a script of exact bytes or with a behaviour per connection, a
forward proxy (absolute-form requests and CONNECT tunnels), and a client that writes and reads
HTTP/1.1 by hand."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

GUARD_S = 10


def answer(body: bytes, *head: bytes, status: bytes = b"200 OK") -> bytes:
    """A whole HTTP/1.1 answer framed by Content-Length."""
    lines = [b"HTTP/1.1 " + status, *head, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def header_of(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` in a raw head (the first one), as its bytes."""
    found = re.search(rb"(?im)^" + re.escape(name) + rb":[ \t]*(.*?)[ \t]*\r$", head)
    return found[1] if found else None


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class Seen:
    connection: int
    head: bytes
    body: bytes

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        return header_of(self.head, name)


# What the upstream does with one request: the bytes it answers, and whether it then closes;
# or a coroutine function that takes the connection over from the head on (it gets the head).
Custom = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Step = tuple[bytes, bool] | Custom


@dataclass
class ScriptedWire:
    """Answers the n-th request it reads with `script[n]`, on whichever connection it came."""

    script: list[Step]
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: int = 0
    open_now: int = 0
    most_open: int = 0
    # Before answering the n-th request (from 0), wait for hold[n] to be set.
    hold: dict[int, asyncio.Event] = field(default_factory=dict)
    writers: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def stop(self) -> None:
        """End every connection still being served (a script step may be waiting)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        number = self.connections
        self.writers[number] = writer
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                seen = Seen(number, head, b"")
                step = self.script[len(self.seen)]
                self.seen.append(seen)
                if not isinstance(step, tuple):
                    await step(head, reader, writer)
                    return
                seen.body = await read_body(reader, seen)
                held = self.hold.get(len(self.seen) - 1)
                if held is not None:
                    await held.wait()
                data, close_after = step
                writer.write(data)
                await writer.drain()
                if close_after:
                    return
        except (ConnectionError, asyncio.LimitOverrunError):
            return
        finally:
            self.open_now -= 1
            self.writers.pop(number, None)
            self.closed += 1
            writer.transport.abort()
            self.tasks.discard(task)


async def read_body(reader: asyncio.StreamReader, seen: Seen) -> bytes:
    length = seen.header(b"content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    if (seen.header(b"transfer-encoding") or b"").lower() != b"chunked":
        return b""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        body += await reader.readexactly(size)
        await reader.readexactly(2)
        if size == 0:
            return bytes(body)


@dataclass
class ForwardProxy:
    """An HTTP forward proxy: relays absolute-form requests and tunnels CONNECT, recording
    each request line it was sent."""

    url: str = ""
    lines: list[bytes] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            writer.transport.abort()
            self.tasks.discard(task)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.heads.append(head)
        line = head.split(b"\r\n", 1)[0]
        self.lines.append(line)
        method, target, _ = line.split(b" ", 2)
        if method == b"CONNECT":
            host, port = target.rsplit(b":", 1)
            up_reader, up_writer = await asyncio.open_connection(host.decode(), int(port))
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            rest = b""
        else:
            match = re.match(rb"http://([^/:]+):(\d+)(/.*)", target)
            assert match is not None, target
            up_reader, up_writer = await asyncio.open_connection(match[1].decode(), int(match[2]))
            rest = head.replace(target, match[3], 1)
        up_writer.write(rest)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


# A client on a bare socket


async def connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = URL(base)
    return await asyncio.open_connection(url.host, url.port)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with suppress(ConnectionError):
        await writer.wait_closed()


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the peer closes (a reset counts as closing)."""
    data = bytearray()
    with suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return bytes(data)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json")
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 answer with a Content-Length (every answer these tests read has one)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }
    data = await reader.readexactly(int(headers["content-length"]))
    return Answer(int(status_line.split()[1]), headers, data)


def request_head(target: str = "/v1/responses", **headers: str | int) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunks_of(data: bytes, size: int = 1) -> bytes:
    """`data` in chunks of `size` bytes, and the last chunk."""
    chunks = (data[i : i + size] for i in range(0, len(data), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


async def exchange_raw(base: str, request: bytes) -> bytes:
    """Send exact request bytes on a connection of their own; the whole answer, to EOF."""
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), GUARD_S)
    finally:
        writer.close()
        await writer.wait_closed()


# An upstream on bare sockets with a behaviour per connection


Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]


OK_BODY = b'{"object":"response","id":"resp_ok","output":[]}'


def answer_head(content_type: bytes, framing: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s\r\nConnection: close\r\n\r\n" % (
        content_type,
        framing,
    )


async def answer_ok(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proceed: asyncio.Event
) -> None:
    writer.write(answer_head(b"application/json", b"Content-Length: %d" % len(OK_BODY)) + OK_BODY)
    await writer.drain()


@dataclass
class RawUpstream:
    """An upstream on bare sockets: the first request gets `first`, later ones a plain answer.

    `whole` keeps each request it read whole; `open` counts its open connections.
    """

    first: Behaviour
    url: str = ""
    whole: list[bytes] = field(default_factory=list)
    open: int = 0
    heads: int = 0
    head_read: asyncio.Event = field(default_factory=asyncio.Event)
    proceed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads += 1
            self.head_read.set()
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            request = head + await reader.readexactly(int(length[1]) if length else 0)
            self.whole.append(request)
            behave = self.first if self.heads == 1 else answer_ok
            await behave(reader, writer, self.proceed)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await close(writer)
            self.open -= 1
