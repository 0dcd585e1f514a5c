"""`hash-key`: the digest a client key is listed under."""

from __future__ import annotations

import hashlib

import pytest

from tests.state.audit_logs import replay_proxy


@pytest.mark.parametrize(
    ("stdin", "key"),
    [
        pytest.param(b"sk-test-1\n", b"sk-test-1", id="newline"),
        pytest.param(b"sk-test-1", b"sk-test-1", id="no-newline"),
        pytest.param(b"sk-test-1\r\n", b"sk-test-1", id="crlf"),
        pytest.param(b"spaced key\n", b"spaced key", id="inner-space-kept"),
        pytest.param("ключ-🔑\n".encode(), "ключ-🔑".encode(), id="utf-8"),
    ],
)
def test_hash_key_prints_the_sha256_of_the_key(stdin: bytes, key: bytes) -> None:
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        hashlib.sha256(key).hexdigest() + "\n",
        "",
    )


@pytest.mark.parametrize("stdin", [b"", b"\n", b"\r\n"], ids=["empty", "newline", "crlf"])
def test_hash_key_refuses_an_empty_key(stdin: bytes) -> None:
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "replay-proxy: hash-key: the key is empty\n"


@pytest.mark.parametrize(
    "stdin",
    [b" sk-test-1\n", b"sk-test-1 \n", b"sk-test-1\t", b"sk-test-1\n\n"],
    ids=["leading-space", "trailing-space", "tab", "second-newline"],
)
def test_hash_key_refuses_a_key_no_request_can_carry(stdin: bytes) -> None:
    """Header values are trimmed, and so is a Bearer token: the hash could never match."""
    done = replay_proxy("hash-key", stdin=stdin)
    assert (done.returncode, done.stdout) == (2, "")
    assert "starts or ends with whitespace" in done.stderr
