"""A 10 GiB gzip bomb, a few hundred bytes on the wire, inflates no further than the limit."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest

from proxy.admission import body
from tests.builders import BOMB, MiB, crc32_of_zeros, gzip_of_zeros


@pytest.mark.parametrize("size", [0, 1, 255, 4096, 3 * MiB + 7])
def test_crc32_of_zeros(size: int) -> None:
    assert crc32_of_zeros(size) == zlib.crc32(bytes(size))


def test_the_bomb_is_a_valid_gzip_of_zeros() -> None:
    assert gzip.decompress(gzip_of_zeros(3)) == bytes(3 * MiB)
    assert len(BOMB) < 4096


def test_bomb_inflates_no_further_than_the_limit() -> None:
    limit = 16 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(body.BodyError) as caught:
            body.decode(BOMB, ["gzip", "gzip", "gzip"], limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (caught.value.status, caught.value.code) == (413, "body_too_large")
    # The 10 MiB middle layer, the limit, and copies of them: never the 10 GiB.
    assert peak < 5 * limit
