"""Raw-socket doubles on 127.0.0.1: an upstream that answers from a script of exact bytes, and a
forward proxy (absolute-form requests and CONNECT tunnels), for the bytes a real server would
not produce."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

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
