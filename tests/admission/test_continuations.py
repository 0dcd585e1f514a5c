"""A WebSocket connection's continuations: a frame the proxy failed evicts the response it
continued, and a later frame naming it is refused with `previous_response_not_found`."""

from __future__ import annotations

import pytest

from proxy.admission.continuations import Continuations, previous_response_id

CONTINUES_A = b'{"type":"response.create","previous_response_id":"resp_a","input":"x"}'
CONTINUES_B = b'{"type":"response.create","previous_response_id":"resp_b","input":"x"}'
STARTS = b'{"type":"response.create","input":"x"}'


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        pytest.param(CONTINUES_A, "resp_a", id="continues"),
        pytest.param(STARTS, None, id="starts-a-chain"),
        pytest.param(b'{"previous_response_id":null}', None, id="null"),
        pytest.param(b'{"previous_response_id":7}', None, id="not-a-string"),
        pytest.param(b"{not json", None, id="unreadable"),
        pytest.param(b'["resp_a"]', None, id="not-an-object"),
        # Duplicate keys are unreadable to the proxy: it names no response, as the gate reads it.
        pytest.param(
            b'{"previous_response_id":"resp_a","previous_response_id":"resp_b"}',
            None,
            id="duplicate-key",
        ),
    ],
)
def test_the_response_a_frame_continues(raw: bytes, named: str | None) -> None:
    assert previous_response_id(raw) == named


@pytest.mark.parametrize(
    ("failed", "then", "refused"),
    [
        pytest.param([CONTINUES_A], CONTINUES_A, "resp_a", id="same-response-refused"),
        pytest.param([CONTINUES_A], CONTINUES_B, None, id="other-response-goes-on"),
        pytest.param([CONTINUES_A], STARTS, None, id="new-chain-goes-on"),
        pytest.param([], CONTINUES_A, None, id="nothing-failed"),
        pytest.param([STARTS], CONTINUES_A, None, id="failed-frame-continued-nothing"),
        pytest.param([b"{not json"], CONTINUES_A, None, id="failed-frame-unreadable"),
        pytest.param([CONTINUES_B, CONTINUES_A], CONTINUES_B, "resp_b", id="both-evicted"),
    ],
)
def test_a_failed_continuation_evicts_what_it_continued(
    failed: list[bytes], then: bytes, refused: str | None
) -> None:
    continuations = Continuations()
    for raw in failed:
        continuations.failed(raw)

    answer = continuations.refusal(then)

    if refused is None:
        assert answer is None
    else:
        assert answer is not None
        assert (answer.status, answer.code, answer.param) == (
            400,
            "previous_response_not_found",
            "previous_response_id",
        )
        assert answer.type == "invalid_request_error"
        assert refused in answer.message


def test_a_connection_remembers_a_bounded_number_of_evictions() -> None:
    continuations = Continuations(limit=2)
    for name in ("resp_1", "resp_2", "resp_3"):
        continuations.failed(b'{"previous_response_id":"%s"}' % name.encode())

    assert len(continuations) == 2
    # The oldest is forgotten first; the newest two are still refused.
    assert continuations.refusal(b'{"previous_response_id":"resp_1"}') is None
    assert continuations.refusal(b'{"previous_response_id":"resp_3"}') is not None
    assert continuations.refusal(b'{"previous_response_id":"resp_2"}') is not None
