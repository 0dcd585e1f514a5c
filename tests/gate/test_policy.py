"""A policy setting that cannot be used is named."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.gate.policy import Policy


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"action": "blok"}, "action", id="bad-action"),
        pytest.param({"actions": {"orphn": "block"}}, "actions.orphn", id="unknown-reason"),
        pytest.param({"actions": {"orphan": "allow"}}, "actions.orphan", id="bad-override"),
        pytest.param({"actions": {"orphan": "rewrite"}}, "actions.orphan", id="rewrite-an-orphan"),
        pytest.param(
            {"actions": {"duplicate_call_id": "rewrite"}},
            "actions.duplicate_call_id",
            id="rewrite-a-duplicate",
        ),
        pytest.param(
            {"actions": {"envelope": "rewrite"}}, "actions.envelope", id="rewrite-an-envelope"
        ),
        pytest.param(
            {"actions": {"unknown_reference": "rewrite"}},
            "actions.unknown_reference",
            id="rewrite-an-unknown-reference",
        ),
        pytest.param(
            {"actions": {"ambiguous_item": "rewrite"}},
            "actions.ambiguous_item",
            id="rewrite-an-ambiguous-item",
        ),
        pytest.param(
            {"actions": {"foreign_item": "rewrite"}},
            "actions.foreign_item",
            id="rewrite-a-foreign-item",
        ),
        pytest.param(
            {"actions": {"not_portable": "rewrite"}},
            "actions.not_portable",
            id="rewrite-a-non-portable-pair",
        ),
        pytest.param({"vendor": "acme:x"}, "vendor", id="vendor-with-colon"),
        pytest.param({"vendor": ""}, "vendor", id="vendor-empty"),
        pytest.param({"vendor": 5}, "vendor", id="vendor-not-a-string"),
        pytest.param({"tools": {"t": {"type": 12}}}, "tools.t", id="invalid-pinned-schema"),
        pytest.param({"tools": {"t": {"$schema": 7}}}, "tools.t", id="pinned-schema-not-str"),
    ],
)
def test_policy_names_the_bad_setting(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message}: "):
        Policy(**settings)
