"""Which raw request targets the gate inspects: one row a case, no event loop."""

from __future__ import annotations

import pytest

from proxy.routes import gated_path, normalise, split_target


@pytest.mark.parametrize(
    ("raw_path", "expected"),
    [
        pytest.param("/v1/responses", "/v1/responses", id="canonical"),
        pytest.param("/v1/responses/compact", "/v1/responses/compact", id="compact"),
        pytest.param("/responses", "/responses", id="no-v1"),
        pytest.param("/responses/compact", "/responses/compact", id="no-v1-compact"),
        pytest.param("/v1/responses/", "/v1/responses", id="trailing-slash"),
        pytest.param("//v1//responses/", "/v1/responses", id="duplicate-slashes"),
        pytest.param("/v1/./responses", "/v1/responses", id="dot-segment"),
        pytest.param("/v1/x/../responses", "/v1/responses", id="dot-dot-segment"),
        pytest.param("/../v1/responses", "/v1/responses", id="dot-dot-above-root"),
        pytest.param("/v1/%2E%2E/v1/responses", "/v1/responses", id="encoded-dot-dot"),
        pytest.param("/v1/%2e/responses", "/v1/responses", id="encoded-dot-lower"),
        pytest.param("/v1/respons%65s", "/v1/responses", id="encoded-unreserved"),
        pytest.param("/%76%31/%72esponses", "/v1/responses", id="encoded-letters-and-digit"),
        pytest.param("/V1/Responses", "/v1/responses", id="case"),
        pytest.param("/V1/RESPONSES/COMPACT", "/v1/responses/compact", id="case-compact"),
        pytest.param("/v1%2Fresponses", "/v1/responses", id="encoded-slash"),
        pytest.param(
            "/v1%2fresponses%2Fcompact", "/v1/responses/compact", id="encoded-slash-lower"
        ),
        pytest.param("/v1\\responses", "/v1/responses", id="backslash"),
        pytest.param("/v1%5Cresponses", "/v1/responses", id="encoded-backslash"),
        pytest.param("/v1/responses;v=1", "/v1/responses", id="path-parameter"),
        pytest.param("/v1;x/responses", "/v1/responses", id="path-parameter-inner"),
        pytest.param("/v1/responses/compact/", "/v1/responses/compact", id="compact-trailing"),
        pytest.param("/v1/responses/compact/..", "/v1/responses", id="compact-dot-dot"),
        pytest.param("/v1/models", None, id="models"),
        pytest.param("/v1/responses/resp_1", None, id="retrieve"),
        pytest.param("/v1/responses/resp_1/input_items", None, id="input-items"),
        pytest.param("/v1/responses/compact/x", None, id="below-compact"),
        pytest.param("/v1/responsesx", None, id="longer-name"),
        pytest.param("/v2/responses", None, id="other-version"),
        pytest.param("/v1/responses/..", None, id="dot-dot-leaves"),
        pytest.param("/v1/chat/completions", None, id="chat-completions"),
        pytest.param("/-/healthy", None, id="admin"),
        pytest.param("/", None, id="root"),
    ],
)
def test_gated_path(raw_path: str, expected: str | None) -> None:
    assert gated_path(raw_path) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/v1/responses", "/v1/responses", id="unchanged"),
        pytest.param("", "/", id="empty"),
        pytest.param("/", "/", id="root"),
        pytest.param("//a//b//", "/a/b", id="duplicate-slashes"),
        pytest.param("/a/./b/.", "/a/b", id="dot"),
        pytest.param("/a/b/../c", "/a/c", id="dot-dot"),
        pytest.param("/../../a", "/a", id="dot-dot-above-root"),
        pytest.param("/%61%2D%2E%5F%7E%30", "/a-._~0", id="unreserved-decoded"),
        pytest.param("/a%2Fb", "/a%2Fb", id="reserved-slash-kept"),
        pytest.param("/a%20b", "/a%20b", id="space-kept"),
        pytest.param("/a%3Bb", "/a%3Bb", id="semicolon-kept"),
        pytest.param("/%2E%2E/a", "/a", id="encoded-dot-dot"),
        pytest.param("/A/B", "/A/B", id="case-kept"),
    ],
)
def test_normalise(path: str, expected: str) -> None:
    assert normalise(path) == expected


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param("/v1/responses", ("/v1/responses", ""), id="no-query"),
        pytest.param("/v1/responses?a=1&b=2", ("/v1/responses", "?a=1&b=2"), id="query"),
        pytest.param("/v1/responses?", ("/v1/responses", "?"), id="empty-query"),
        pytest.param("/a?b?c", ("/a", "?b?c"), id="question-mark-in-query"),
        pytest.param("http://h/v1/responses?x=1", ("/v1/responses", "?x=1"), id="absolute-form"),
        pytest.param("HTTPS://u@h:1/V1/Responses", ("/V1/Responses", ""), id="absolute-form-case"),
        pytest.param("http://h", ("/", ""), id="absolute-form-no-path"),
        pytest.param("http://h?x", ("/", "?x"), id="absolute-form-query-only"),
    ],
)
def test_split_target(target: str, expected: tuple[str, str]) -> None:
    assert split_target(target) == expected
