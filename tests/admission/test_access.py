"""An access line's outcome is a named value (`Outcome`) that writes as the same string it
always did: the access line, the metrics' `outcome` label and the logs stay byte-identical."""

from __future__ import annotations

import json
import logging

import pytest

from proxy.admission.access import Access
from proxy.gate.reasons import Outcome
from proxy.running.logs import JsonFormatter, TextFormatter
from proxy.state.metrics import Metrics

# Every outcome and the string it writes, as docs/operations.md and dashboards spell them.
WRITTEN = [
    (Outcome.FORWARD, "forward"),
    (Outcome.STRIP, "strip"),
    (Outcome.REWRITE, "rewrite"),
    (Outcome.BLOCK, "block"),
    (Outcome.INVALID, "invalid"),
    (Outcome.INVALID_TARGET, "invalid_target"),
    (Outcome.NOT_FOUND, "not_found"),
    (Outcome.UNAUTHORIZED, "unauthorized"),
    (Outcome.LEDGER_UNAVAILABLE, "ledger_unavailable"),
    (Outcome.UPSTREAM_ERROR, "upstream_error"),
    (Outcome.ERROR, "error"),
    (Outcome.ADMIN, "admin"),
    (Outcome.CLIENT_GONE, "client_gone"),
    (Outcome.UPSTREAM_CUT, "upstream_cut"),
]
# Written on the access line only, never counted in `replay_proxy_requests_total`.
ACCESS_ONLY = {Outcome.ERROR, Outcome.ADMIN, Outcome.CLIENT_GONE, Outcome.UPSTREAM_CUT}


def test_every_outcome_is_listed() -> None:
    assert [member for member, _ in WRITTEN] == list(Outcome)


@pytest.mark.parametrize(("outcome", "written"), WRITTEN, ids=[w for _, w in WRITTEN])
def test_an_outcome_is_its_string(outcome: Outcome, written: str) -> None:
    assert outcome == written
    assert (str(outcome), f"{outcome}", json.dumps(outcome)) == (written, written, f'"{written}"')
    assert Outcome(written) is outcome


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param("replay_rejected", Outcome.BLOCK, id="blocked"),
        pytest.param("body_too_large", Outcome.ERROR, id="error"),
    ],
)
def test_a_failure_sets_a_named_outcome(code: str, expected: Outcome) -> None:
    access = Access("req_1", "POST", "/v1/responses")
    access.failed(code)
    assert access.outcome is expected
    assert access.fields()["outcome"] == expected.value


def test_the_access_line_writes_the_outcome_as_before() -> None:
    access = Access("req_1", "POST", "/v1/responses", outcome=Outcome.CLIENT_GONE)
    record = logging.LogRecord("replay_proxy.access", logging.INFO, "", 0, "done", (), None)
    record.access = {"outcome": access.fields()["outcome"]}
    assert TextFormatter().format(record).endswith(": done outcome=client_gone")
    assert json.loads(JsonFormatter().format(record))["outcome"] == "client_gone"


def test_metrics_label_each_counted_outcome_by_its_string() -> None:
    metrics = Metrics()
    counted = [o for o in Outcome if o not in ACCESS_ONLY]
    for outcome in counted:
        metrics.count("responses", outcome, "-", "responses")
    labels = {
        sample.labels["outcome"]
        for family in metrics.registry.collect()
        if family.name == "replay_proxy_requests"
        for sample in family.samples
        if sample.name == "replay_proxy_requests_total"
    }
    assert labels == {o.value for o in counted}
    # The metric's own help names every outcome it counts.
    assert all(f"`{o.value}`" in metrics.requests._documentation for o in counted)


def test_findings_are_counted_by_action_on_the_access_line() -> None:
    access = Access("req_1", "POST", "/v1/responses")
    access.found(["strip", "log", "strip"])
    access.found([])
    access.found(["block"])
    fields = access.fields()
    assert (fields["findings"], fields["findings_block"]) == (4, 1)
    assert (fields["findings_log"], fields["findings_strip"]) == (1, 2)
    # In the order of their actions' names, after the total.
    named = [name for name in fields if name.startswith("findings")]
    assert named == ["findings", "findings_block", "findings_log", "findings_strip"]
