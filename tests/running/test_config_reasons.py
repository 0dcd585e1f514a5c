"""The config takes an action for each of the gate's newer reasons, and names one it cannot."""

from __future__ import annotations

import pytest

from proxy.running.config_file import parse_config
from proxy.settings import ConfigError


@pytest.mark.parametrize(
    ("reason", "action"),
    [
        pytest.param("foreign_item", "strip", id="foreign-item-strip"),
        pytest.param("foreign_item", "log", id="foreign-item-log"),
        pytest.param("not_portable", "strip", id="not-portable-strip"),
        pytest.param("not_portable", "log", id="not-portable-log"),
    ],
)
def test_actions_take_the_reason(reason: str, action: str) -> None:
    config = parse_config({"gate": {"action": "block", "actions": {reason: action}}})
    assert config.gate.action_for(reason) == action
    assert config.gate.action_for("orphan") == "block"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        pytest.param("foreign_item", "gate.actions.foreign_item: rewrite", id="foreign-item"),
        pytest.param("not_portable", "gate.actions.not_portable: rewrite", id="not-portable"),
        pytest.param("not_portabel", "gate.actions.not_portabel: unknown reason", id="misspelt"),
    ],
)
def test_mistakes_name_the_key(reason: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        parse_config({"gate": {"actions": {reason: "rewrite"}}})


def test_rewrite_by_default_blocks_them() -> None:
    gate = parse_config({"gate": {"action": "rewrite"}}).gate
    assert [gate.action_for(r) for r in ("foreign_item", "not_portable", "status")] == [
        "block",
        "block",
        "rewrite",
    ]
