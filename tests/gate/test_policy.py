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
        pytest.param({"tools": {"t": {"type": 12}}}, "tools.t", id="invalid-pinned-schema"),
        pytest.param({"tools": {"t": {"$schema": 7}}}, "tools.t", id="pinned-schema-not-str"),
    ],
)
def test_policy_names_the_bad_setting(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message}: "):
        Policy(**settings)
