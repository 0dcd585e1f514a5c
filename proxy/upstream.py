"""Forwarding to the upstream: one connection pool, hop-by-hop headers dropped, answers streamed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy import config, http1

log = logging.getLogger("replay_proxy")

# RFC 9110 §7.6.1: meaningful for one connection only; never relayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)
# Set by the hop itself (its Host, its body's framing), or answered by this server (Expect).
_REQUEST_OWN = ("Host", "Content-Length", "Expect")
# What gives a body its meaning: a `Connection` header may not remove them (RFC 9110 §7.6.1
# lets it name any header). A request that tries is refused; in an answer the names are
# ignored, so that the client decodes the body the way the tap read it.
BODY_HEADERS = frozenset(
    {"content-type", "content-encoding", "content-length", "transfer-encoding"}
)


class Tap(Protocol):
    """Sees each chunk of an answer before it is forwarded, and its end before EOF is sent."""

    async def feed(self, chunk: bytes) -> None: ...

    async def finish(self) -> None: ...


# What the client is told of each failure; the detail stays in the log.
_MESSAGES = {
    "upstream_unreachable": "upstream_unreachable: the proxy could not reach the upstream",
    "upstream_timeout": "upstream_timeout: the upstream did not answer in time",
    "upstream_bad_response": "upstream_bad_response: the upstream's answer is not valid HTTP",
    "upstream_refused": "upstream_refused: the upstream refused the WebSocket upgrade",
}


@dataclass(frozen=True)
class UpstreamError(Exception):
    """No answer could be had from the upstream: 502 (unreachable, garbage), 504 (timeout), or
    the status of a refused WebSocket upgrade. `detail` is for the log only: it can carry the
    upstream's address and the socket's error."""

    status: int
    code: str
    detail: str

    @property
    def message(self) -> str:
        return _MESSAGES[self.code]


def connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> list[str]:
    """The header names a `Connection` header lists, lower-cased, in order."""
    return [
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    ]


def body_headers_named(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> list[str]:
    """The headers of BODY_HEADERS that `Connection` names (a request naming any is refused)."""
    return [token for token in connection_tokens(headers) if token in BODY_HEADERS]


def relayed_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    """The headers minus hop-by-hop ones, those the `Connection` header names (never one of
    BODY_HEADERS), and `drop`."""
    named = set(connection_tokens(headers)) - BODY_HEADERS
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in drop:
            continue
        out.add(name, value)
    return out


class Upstream:
    """The upstream server: one pool of keep-alive connections every request shares, and an
    aiohttp session for WebSocket upgrades."""

    def __init__(self, settings: config.Upstream) -> None:
        self.settings = settings
        self.base = URL(settings.url.rstrip("/"))
        self.pool = http1.Pool(
            self.base,
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
        )
        self._session: aiohttp.ClientSession | None = None
        self._users = 0
        self._retired = False
        self.closed = False

    def acquire(self) -> None:
        """A request starts using this upstream (it read it from the config in force)."""
        self._users += 1

    async def release(self) -> None:
        """That request is done; a retired upstream closes with its last one."""
        self._users -= 1
        if self._retired and not self._users:
            await self.close()

    async def retire(self) -> None:
        """A reload replaced this upstream: close it once no request uses it any more."""
        self._retired = True
        if not self._users:
            await self.close()

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.settings.connect_timeout_s,
                sock_read=self.settings.read_timeout_s,
            ),
            # The proxy relays bytes: no decoding, no default headers, no cookies of its own.
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        self.closed = True
        self.pool.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    def url(self, target: str) -> URL:
        """The upstream URL for a raw request target (path and query, still encoded)."""
        return URL(str(self.base) + target, encoded=True)

    async def connect_websocket(
        self, target: str, headers: CIMultiDict[str], protocols: list[str], max_msg_size: int
    ) -> aiohttp.ClientWebSocketResponse:
        """Open the same WebSocket upstream; raises UpstreamError when it cannot be had."""
        try:
            return await self.session.ws_connect(
                self.url(target),
                headers=headers,
                protocols=protocols,
                max_msg_size=max_msg_size,
                autoping=True,
            )
        except aiohttp.WSServerHandshakeError as exc:
            detail = f"status {exc.status}: {exc.message}"
            if 400 <= exc.status < 600:
                raise UpstreamError(exc.status, "upstream_refused", detail) from None
            raise UpstreamError(502, "upstream_bad_response", detail) from None
        except TimeoutError:
            raise UpstreamError(504, "upstream_timeout", "no WebSocket handshake in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, "upstream_unreachable", str(exc)) from None

    async def relay(
        self,
        request: web.Request,
        target: str,
        *,
        request_id: str,
        data: bytes | AsyncIterable[bytes] | None,
        headers: CIMultiDict[str],
        extra_headers: Mapping[str, str] | None = None,
        tap_for: Callable[[http1.Answer], Tap | None] | None = None,
    ) -> web.StreamResponse:
        """Send the request upstream and stream the answer back chunk by chunk.

        Raises UpstreamError when no answer arrives; once the answer has started, an upstream
        failure cuts the client's connection so that it cannot mistake a partial answer for
        a whole one.
        """
        for name in _REQUEST_OWN:
            headers.popall(name, None)
        length = None if isinstance(data, bytes) else request.content_length
        try:
            upstream = await self.pool.request(
                request.method, target, headers.items(), data, length=length
            )
        except TimeoutError:
            raise UpstreamError(504, "upstream_timeout", "no answer in time") from None
        except http1.ConnectError as exc:
            raise UpstreamError(
                502, "upstream_unreachable", f"cannot connect to {self.base}: {exc}"
            ) from None
        except http1.BadAnswer as exc:
            raise UpstreamError(502, "upstream_bad_response", f"garbage: {exc}") from None
        except (http1.BrokenAnswer, OSError) as exc:
            raise UpstreamError(
                502, "upstream_unreachable", f"the connection failed: {exc}"
            ) from None
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            if upstream.arrived:
                # The head goes out with the first chunk, in one write; aiohttp's own Response
                # does this, StreamResponse sends the head on its own unless told not to.
                response._send_headers_immediately = False
            response.headers.update(relayed_headers(upstream.headers))
            if extra_headers:
                response.headers.update(extra_headers)
            tap = tap_for(upstream) if tap_for is not None else None
            try:
                await response.prepare(request)
                async for chunk in upstream.chunks():
                    if tap is not None:
                        await tap.feed(chunk)
                    await response.write(chunk)
                if tap is not None:
                    await tap.finish()
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                # The client hung up: the upstream connection is closed, not reused.
                log.info(
                    "%s client went away mid-answer: %s %s", request_id, request.method, target
                )
                return response
            except (TimeoutError, http1.BrokenAnswer, http1.BadAnswer) as exc:
                log.warning(
                    "%s upstream failed mid-answer: %s %s: %s",
                    request_id,
                    request.method,
                    target,
                    exc,
                )
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
            return response
        finally:
            upstream.release()
