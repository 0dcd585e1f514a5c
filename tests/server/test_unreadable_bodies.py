"""Bodies the proxy cannot read unambiguously: never forwarded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import aiohttp
import brotli
import pytest

from tests.builders import (
    JSON_HEADERS,
    at,
    audit_records,
    clean_body,
    odd_bytes,
    sales_call,
    sales_output,
    stream_of,
)
from tests.fixture_types import ProxyFactory
from tests.servers.recording import RecordingUpstream

LIMIT = 4096
GZIPPED = gzip.compress(json.dumps(clean_body()).encode())
CLEAN_CALL = json.dumps(sales_call("call_1"))
# The same call with `arguments` twice: a last-wins parser reads a clean call, a first-wins one not.
DUPLICATED = CLEAN_CALL.replace(
    '"arguments"', '"arguments": "{\\"region\\": \\"mars\\"}", "arguments"'
)
BAD_INPUT = [
    pytest.param({}, b"{}", 415, "unsupported_media_type", id="no-content-type"),
    pytest.param({"Content-Type": "text/plain"}, b"{}", 415, "unsupported_media_type", id="text"),
    pytest.param(
        {"Content-Type": "application/x-www-form-urlencoded"},
        b"input=hi",
        415,
        "unsupported_media_type",
        id="form",
    ),
    pytest.param(
        {"Content-Type": "application/json; charset=latin-1"},
        b"{}",
        415,
        "unsupported_charset",
        id="latin-1",
    ),
    pytest.param(
        JSON_HEADERS | {"Content-Encoding": "compress"},
        b"{}",
        415,
        "unsupported_content_encoding",
        id="compress-coding",
    ),
    pytest.param(
        JSON_HEADERS,
        b'{"input": "' + b"a" * LIMIT + b'"}',
        413,
        "body_too_large",
        id="too-large-raw",
    ),
    pytest.param(
        JSON_HEADERS,
        [b'{"input": "', b"a" * LIMIT, b'"}'],
        413,
        "body_too_large",
        id="too-large-raw-chunked",
    ),
    pytest.param(
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        gzip.compress(b'{"input": "' + b"a" * (1 << 20) + b'"}'),
        413,
        "body_too_large",
        id="gzip-bomb",
    ),
    pytest.param(
        JSON_HEADERS | {"Content-Encoding": "br"},
        brotli.compress(b'{"input": "' + b"a" * (1 << 20) + b'"}'),
        413,
        "body_too_large",
        id="br-bomb",
    ),
    pytest.param(JSON_HEADERS, b"input=hello", 400, "invalid_json", id="not-json"),
    pytest.param(JSON_HEADERS, b"", 400, "invalid_json", id="empty"),
    pytest.param(JSON_HEADERS, b'{"input": []} {}', 400, "invalid_json", id="trailing-data"),
    pytest.param(JSON_HEADERS, b'[{"input": []}]', 400, "invalid_body", id="not-an-object"),
    pytest.param(JSON_HEADERS, b'{"input": 42}', 400, "invalid_input", id="input-number"),
    pytest.param(
        JSON_HEADERS, b'{"input": {"role": "user"}}', 400, "invalid_input", id="input-object"
    ),
    pytest.param(
        JSON_HEADERS, b'{"model": "a", "model": "b"}', 400, "invalid_json", id="duplicate-key"
    ),
    pytest.param(
        JSON_HEADERS,
        f'{{"input": [{DUPLICATED}, {json.dumps(sales_output("call_1"))}]}}'.encode(),
        400,
        "invalid_json",
        id="duplicate-key-at-depth",
    ),
    pytest.param(JSON_HEADERS, b'{"input": [], "temperature": NaN}', 400, "invalid_json", id="nan"),
    pytest.param(
        JSON_HEADERS, b'{"input": [], "top_p": Infinity}', 400, "invalid_json", id="infinity"
    ),
    pytest.param(JSON_HEADERS, b'{"input": "caf\xe9"}', 400, "invalid_json", id="invalid-utf-8"),
    pytest.param(JSON_HEADERS, b'{"input": "\\ud83d"}', 400, "invalid_json", id="lone-surrogate"),
    pytest.param(
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        GZIPPED[:12] + bytes(b ^ 0xFF for b in GZIPPED[12:40]) + GZIPPED[40:],
        400,
        "invalid_content_encoding",
        id="corrupt-gzip",
    ),
    pytest.param(
        JSON_HEADERS | {"Content-Encoding": "gzip"},
        GZIPPED[: len(GZIPPED) // 2],
        400,
        "invalid_content_encoding",
        id="truncated-gzip",
    ),
]


@pytest.mark.parametrize("path", ["/v1/responses", "/responses/compact"])
@pytest.mark.parametrize(("headers", "data", "status", "code"), BAD_INPUT)
async def test_unreadable_body_is_answered_and_never_forwarded(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    tmp_path: Path,
    path: str,
    headers: dict[str, str],
    data: bytes | list[bytes],
    status: int,
    code: str,
) -> None:
    base = await start_proxy(recording_upstream.url, limits={"max_body_bytes": LIMIT})
    payload = stream_of(*data) if isinstance(data, list) else data

    async with client.post(
        at(base, path), data=payload, headers=headers, skip_auto_headers={"Content-Type"}
    ) as resp:
        assert resp.status == status
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]

    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert recording_upstream.received == []
    assert audit_records(tmp_path) == []


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "application/json;charset=UTF-8", "Application/JSON"],
)
async def test_json_content_type_with_charset_is_accepted(
    recording_upstream: RecordingUpstream,
    start_proxy: ProxyFactory,
    client: aiohttp.ClientSession,
    content_type: str,
) -> None:
    base = await start_proxy(recording_upstream.url)
    sent = odd_bytes(clean_body())

    async with client.post(
        at(base, "/v1/responses"), data=sent, headers={"Content-Type": content_type}
    ) as resp:
        assert resp.status == 200

    [got] = recording_upstream.received
    assert (got.body, got.headers["Content-Type"]) == (sent, content_type)
