"""Header rules, all of them: hop-by-hop, body, credentials, the hop's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from multidict import CIMultiDict, CIMultiDictProxy

# The codings the tap can read, which every front that records answers asks the upstream for.
from proxy.admission.codings import READABLE_CODINGS as READABLE_CODINGS
from proxy.admission.codings import readable_accept_encoding as readable_accept_encoding
from proxy.admission.credentials import CREDENTIAL_HEADERS

if TYPE_CHECKING:
    # Only a type here: the upstream hop that reads these rules must not load the gate.
    from proxy import settings
    from proxy.config import Config


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
REQUEST_OWN = ("Host", "Content-Length", "Expect")

# What gives a body its meaning: a `Connection` header may not remove them (RFC 9110 §7.6.1
# lets it name any header). A request that tries is refused; in an answer the names are
# ignored, so that the client decodes the body the way the tap read it.
BODY_HEADERS = frozenset(
    {"content-type", "content-encoding", "content-length", "transfer-encoding"}
)


def connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> list[str]:
    """The header names a `Connection` header lists, lower-cased, in order."""
    given = headers.getall("Connection", ())
    if not given:  # the usual answer has none
        return []
    return [token.strip().lower() for value in given for token in value.split(",") if token.strip()]


def body_headers_named(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> list[str]:
    """The headers of BODY_HEADERS that `Connection` names (a request naming any is refused)."""
    return [token for token in connection_tokens(headers) if token in BODY_HEADERS]


def relayed_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    """The headers minus hop-by-hop ones, those the `Connection` header names (never one of
    BODY_HEADERS), and `drop`."""
    left_out = HOP_BY_HOP | drop if drop else HOP_BY_HOP
    named = connection_tokens(headers)
    if named:
        left_out = left_out.union(name for name in named if name not in BODY_HEADERS)
    # Copied whole, then the few names present taken out: a copy is one call of C, and a
    # look-up per name left out is cheaper than a test per header (18 -> 6 k instructions
    # for a request's eight headers).
    out = CIMultiDict(headers)
    for name in left_out:
        if name in out:
            del out[name]  # each of its values
    return out


# Credentials a client presents; when the proxy authenticates clients or holds the upstream
# key itself, they are the proxy's, and never go upstream.
CREDENTIALS = frozenset(CREDENTIAL_HEADERS)


def upstream_headers(
    headers: CIMultiDictProxy[str],
    config: Config,
    drop: frozenset[str],
    upstream: settings.UpstreamSettings | None = None,
) -> CIMultiDict[str]:
    """The client's headers as `upstream` (default: the config's single one) sees them, with
    the proxy's key for it if it holds one."""
    key = (config.upstream if upstream is None else upstream).api_key
    own_credentials = config.clients or key is not None
    out = relayed_headers(headers, drop=(drop | CREDENTIALS) if own_credentials else drop)
    if key is not None:
        out["Authorization"] = f"Bearer {key}"
    return out


def mcp_headers(
    headers: CIMultiDictProxy[str], config: Config, server: str, drop: frozenset[str]
) -> CIMultiDict[str]:
    """The client's headers as the MCP server `server` sees them: its `Mcp-Session-Id` and
    `MCP-Protocol-Version` as sent, the proxy's key for the server if it holds one, and the
    headers the config gives the server (over the client's of the same name). An answer is
    read by the tap as it goes by: only the identity coding is asked for."""
    settings = config.mcp.servers[server]
    out = upstream_headers(headers, config, drop | _CODINGS, settings.upstream)
    for name, value in settings.headers:
        out.popall(name, None)
        out[name] = value
    return out


_CODINGS = frozenset({"accept-encoding"})


# Negotiated per hop by aiohttp on each side; never copied from one hop to the other.
WEBSOCKET_OWN = frozenset(
    {
        "host",
        "content-length",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)
