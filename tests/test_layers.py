"""Imports point down: the pure layers load in a fresh interpreter without the HTTP stack."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HTTP_STACK = ["aiohttp", "multidict", "yarl", "redis"]

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(name for name in sys.modules if "." not in name)))
"""


def loaded(module: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout))


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        pytest.param(
            "proxy.gate.errors", [*HTTP_STACK, "jsonschema", "yaml", "regex"], id="errors"
        ),
        pytest.param("proxy.gate.strictjson", [*HTTP_STACK, "jsonschema", "yaml"], id="strictjson"),
        pytest.param("proxy.gate.items", [*HTTP_STACK, "jsonschema", "yaml"], id="items"),
        pytest.param("proxy.admission.targets", [*HTTP_STACK, "jsonschema", "yaml"], id="routes"),
        pytest.param("proxy.gate.budget", [*HTTP_STACK, "yaml"], id="budget"),
        pytest.param("proxy.gate.schemas", [*HTTP_STACK, "yaml"], id="schemas"),
        pytest.param("proxy.gate.verdict", [*HTTP_STACK, "yaml"], id="gate"),
        pytest.param("proxy.running.check", [*HTTP_STACK, "yaml"], id="check"),
        pytest.param("proxy.config", HTTP_STACK, id="config"),
        # The pipeline every front calls: a third front must not need the first two's stack.
        pytest.param("proxy.admission.pipeline", HTTP_STACK, id="admission"),
        # `replay-proxy check` must not pay for the server it does not run.
        pytest.param("proxy.running.cli", HTTP_STACK, id="cli"),
    ],
)
def test_pure_layer_does_not_load(module: str, forbidden: list[str]) -> None:
    modules = loaded(module)
    assert module.split(".")[0] in modules
    assert modules.isdisjoint(forbidden), sorted(modules & set(forbidden))


def test_probe_sees_what_is_loaded() -> None:
    # The probe itself must be able to fail: aiohttp is found when it is imported.
    assert "aiohttp" in loaded("aiohttp")
