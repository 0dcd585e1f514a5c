"""The upstream reads what the gate judged: decoded bodies."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import pytest
from multidict import CIMultiDict
from yarl import URL

from tests.conftest import (
    SALES_TOOL,
    ProxyFactory,
    RecordingUpstream,
    audit_records,
    sales_call,
    sales_output,
)

HANG_GUARD_S = 10
USER = {"role": "user", "content": "How did APAC do last quarter?"}


def body_of(*items: Any) -> bytes:
    """A body as some client might write it, so that a re-serialising proxy would show."""
    body = {"tools": [SALES_TOOL], "input": [USER, *items], "model": "m"}
    return json.dumps(body, indent="\t", separators=(" ,", " :  ")).encode() + b"\r\n"


CLEAN = body_of(sales_call("call_1"), sales_output("call_1"))
FAILING = body_of(sales_call("call_1", "mars"), sales_output("call_1"))


def raw_deflate(data: bytes) -> bytes:
    squeezer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return squeezer.compress(data) + squeezer.flush()


Encode = Callable[[bytes], bytes]
CODINGS = [
    pytest.param(["gzip"], gzip.compress, id="gzip"),
    pytest.param(["x-gzip"], gzip.compress, id="x-gzip"),
    pytest.param(["deflate"], zlib.compress, id="deflate"),
    pytest.param(["deflate"], raw_deflate, id="raw-deflate"),
    pytest.param(["br"], brotli.compress, id="br"),
    pytest.param(["gzip, br"], lambda d: brotli.compress(gzip.compress(d)), id="gzip-then-br"),
    pytest.param(
        ["gzip", "br"], lambda d: brotli.compress(gzip.compress(d)), id="two-header-lines"
    ),
    # aiohttp as an upstream decodes a single coding token only: it must never see this.
    pytest.param(["identity, br"], brotli.compress, id="identity-then-br"),
    pytest.param(["BR, Identity"], brotli.compress, id="br-then-identity-any-case"),
    pytest.param(["identity"], lambda d: d, id="identity"),
]


@pytest.mark.parametrize(
    ("action", "sent_body"),
    [pytest.param("block", CLEAN, id="clean"), pytest.param("log", FAILING, id="logged")],
)
@pytest.mark.parametrize(("content_encoding", "encode"), CODINGS)
async def test_a_coded_body_goes_upstream_decoded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    tmp_path: Path,
    content_encoding: list[str],
    encode: Encode,
    action: str,
    sent_body: bytes,
) -> None:
    """The recording upstream ignores a request's Content-Encoding (it records the raw bytes),
    as many servers do: what it parses must be exactly the document the gate judged."""
    base = await start_proxy(recording_upstream.url, gate={"action": action})
    sent = encode(sent_body)
    headers = CIMultiDict({"Content-Type": "application/json"})
    for value in content_encoding:
        headers.add("Content-Encoding", value)

    async with (
        aiohttp.ClientSession(auto_decompress=False) as client,
        client.post(URL(base + "/v1/responses", encoded=True), data=sent, headers=headers) as resp,
    ):
        assert resp.status == 200

    [got] = recording_upstream.received
    assert got.body == sent_body
    assert "Content-Encoding" not in got.headers
    assert got.headers["Content-Length"] == str(len(sent_body))
    if action == "log":
        [record] = audit_records(tmp_path)
        assert record["body_sha256"] == hashlib.sha256(sent).hexdigest()
