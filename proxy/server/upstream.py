"""Forwarding to an upstream: one aiohttp client session per upstream, hop-by-hop headers
dropped, answers streamed chunk by chunk."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Final

import aiohttp
from aiohttp.client_proto import ResponseHandler
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy import settings
from proxy.gate.errors import ProxyError
from proxy.server.headers import REQUEST_OWN

log = logging.getLogger("replay_proxy")

# The longest status line or header line, and the most header lines, of an answer's head
# (aiohttp's defaults, which are nginx's 8 KiB): a longer head is a bad answer, refused
# without reading on (RFC 9112 §2.3).
MAX_LINE_BYTES: Final = 8190
MAX_FIELD_BYTES: Final = 8190
MAX_HEADERS: Final = 128
# A body in memory larger than this goes out in slices of this size, each written once the
# connection has taken the one before (aiohttp warns of a larger one written at once).
_SLICE_BYTES: Final = 1 << 20


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


def not_utf8(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> str | None:
    """The name of the first header whose value is not UTF-8, or None.

    aiohttp reads header bytes as UTF-8 and writes them back as UTF-8, so UTF-8 travels
    unchanged both ways; other bytes it reads as lone surrogates and would drop on writing,
    so such a header cannot be relayed as it came.
    """
    if "".join(headers.values()).isascii():
        return None  # the usual case, in one pass of C
    for name, value in headers.items():
        if not value.isascii() and any("\udc80" <= c <= "\udcff" for c in value):
            return name
    return None


class Upstream:
    """The upstream server: one aiohttp client session (one pool of keep-alive connections)
    that every request and WebSocket upgrade to it shares."""

    def __init__(self, settings: settings.UpstreamSettings, name: str = "default") -> None:
        self.settings = settings
        self.name = name
        self.base = URL(settings.url.rstrip("/"))
        self._base = str(self.base)  # each request's URL starts with it
        self._session: aiohttp.ClientSession | None = None
        self._users = 0
        self._retired = False
        self.closed = False

    def acquire(self) -> None:
        """A request starts using this upstream (it read it from the config in force)."""
        self._users += 1

    def leave(self) -> bool:
        """That request is done: whether it was the last one of a retired upstream, which is
        to be closed now."""
        self._users -= 1
        return self._retired and not self._users

    async def release(self) -> None:
        """That request is done; a retired upstream closes with its last one."""
        if self.leave():
            await self.close()

    async def retire(self) -> None:
        """A reload replaced this upstream: close it once no request uses it any more."""
        self._retired = True
        if not self._users:
            await self.close()

    async def start(self) -> None:
        settings = self.settings
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=settings.max_connections,
                limit_per_host=0,
                keepalive_timeout=settings.keepalive_s,
                ssl=tls_context(settings) if self.base.scheme == "https" else True,
                enable_cleanup_closed=True,
            ),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=settings.connect_timeout_s,
                sock_read=settings.read_timeout_s,
            ),
            # The proxy relays bytes: no decoding, no default headers, no cookies of its own.
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
            # The forward proxy was chosen from the environment once, at config load: aiohttp's
            # own trust_env would look it up again per request (in a thread), and would add
            # credentials from ~/.netrc to requests that carry none.
            trust_env=False,
            proxy=settings.proxy,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
        )

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    def url(self, target: str) -> URL:
        """The upstream URL for a raw request target (path and query, still encoded)."""
        return URL(self._base + target, encoded=True)

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

    async def send(
        self,
        method: str,
        target: str,
        *,
        data: bytes | AsyncIterable[bytes] | None,
        headers: CIMultiDict[str],
        content_length: int | None = None,
    ) -> aiohttp.ClientResponse:
        """Send the request upstream (`content_length`: of a streamed body, sent with it, not
        chunked); the answer whose head has arrived, its headers UTF-8. The caller reads its
        body and releases it.

        Raises UpstreamError when no answer arrives.
        """
        for name in REQUEST_OWN:
            headers.popall(name, None)
        body: bytes | AsyncIterable[bytes | memoryview] | None = data
        if isinstance(data, bytes) and len(data) > _SLICE_BYTES:
            headers["Content-Length"] = str(len(data))
            body = _slices(data)
        elif data is not None and not isinstance(data, bytes) and content_length:
            headers["Content-Length"] = str(content_length)
        try:
            answer = await self.session.request(
                method, self.url(target), headers=headers, data=body, allow_redirects=False
            )
        except TimeoutError:
            raise UpstreamError(504, "upstream_timeout", "no answer in time") from None
        except aiohttp.ClientHttpProxyError as exc:
            raise UpstreamError(
                502,
                "upstream_unreachable",
                f"the forward proxy refused: {exc.status} {exc.message}",
            ) from None
        except aiohttp.ClientResponseError as exc:
            # Not str(exc): it names the URL, query included.
            raise UpstreamError(502, "upstream_bad_response", f"garbage: {exc.message}") from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(
                502, "upstream_unreachable", f"cannot connect to {self.base}: {exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                502, "upstream_unreachable", f"the connection failed: {exc!r}"
            ) from None
        bad = not_utf8(answer.headers)
        if bad is not None:
            answer.release()
            raise UpstreamError(502, "upstream_bad_response", f"the value of {bad} is not UTF-8")
        return answer


async def _slices(data: bytes) -> AsyncIterator[memoryview]:
    view = memoryview(data)
    for start in range(0, len(view), _SLICE_BYTES):
        yield view[start : start + _SLICE_BYTES]


def delimited_by_close(method: str, answer: aiohttp.ClientResponse) -> bool:
    """Whether the answer's body ends with its connection (RFC 9112 §6.3, rule 8)."""
    if method == "HEAD" or answer.status < 200 or answer.status in (204, 304):
        return False
    coding = ",".join(answer.headers.getall("Transfer-Encoding", ())).lower()
    return answer.content_length is None and "chunked" not in coding


def cut_of(protocol: ResponseHandler | None) -> BaseException | None:
    """The error a close-delimited answer's connection ended with, unless a FIN ended it."""
    error = protocol.exception() if protocol is not None else None
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return None  # aiohttp's name for a clean close
    return error


def tls_context(settings: settings.UpstreamSettings) -> ssl.SSLContext:
    """The TLS client context for an https upstream: `ca_file` or the system's trust store
    (read when the upstream is made, so SSL_CERT_FILE applies), and the client certificate."""
    context = ssl.create_default_context(cafile=settings.ca_file)
    if settings.client_cert is not None:
        context.load_cert_chain(settings.client_cert, settings.client_key)
    return context


def upstream_failure(request_id: str, what: str, exc: UpstreamError) -> ProxyError:
    """The failure of a request no upstream answer could be had for. Its message names the
    failure only; the detail (an address, a socket error) goes to the log."""
    log.warning("%s %s: %s: %s", request_id, what, exc.code, exc.detail)
    return ProxyError(exc.status, exc.code, exc.message)
