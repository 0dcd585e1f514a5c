"""The item schemas shipped in proxy/gate are the spec's own definitions, copied unchanged.

Run as `python -m tests.gate.test_spec_items [SPEC]` to write the copy again from a spec file
(by default the spec that llm-comply, a test dependency, ships: the same 2026-04-24 text as
the one DESIGN.md names).
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import llm_comply

from proxy.gate import portable

SPEC = Path(llm_comply.__file__).parent / "specs" / "openresponses.json"
VERSION = "2026-04-24"
SHIPPED = Path(__file__).resolve().parents[2] / "proxy" / "gate" / portable.SCHEMAS_FILE
_PREFIX = "#/components/schemas/"


def extract(spec: dict[str, Any], roots: tuple[str, ...] = portable.ROOTS) -> dict[str, Any]:
    """The document shipped in proxy/gate: `roots` and every definition they `$ref`, unchanged."""
    defined = spec["components"]["schemas"]
    found: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop(0)
        if name in found:
            continue
        found[name] = defined[name]
        todo.extend(ref.removeprefix(_PREFIX) for ref in _refs(defined[name]))
    return {
        "$comment": (
            f"{', '.join(roots)} of the Open Responses spec {spec['info']['version']}, with every "
            "definition they $ref, copied unchanged by tests/gate/test_spec_items.py (which "
            "checks the copy)"
        ),
        "info": spec["info"],
        "components": {"schemas": found},
    }


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [
            ref
            for key, value in node.items()
            for ref in ([value] if key == "$ref" else _refs(value))
        ]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_shipped_copy_is_the_specs_definitions() -> None:
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    assert spec["info"]["version"] == VERSION
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert shipped == extract(spec)
    # Every `$ref` is to a definition the copy holds: nothing is resolved outside it.
    assert {r.removeprefix(_PREFIX) for r in _refs(shipped)} <= set(
        shipped["components"]["schemas"]
    )


def test_copy_is_package_data() -> None:
    # Read the way the installed package reads it, not from the source tree.
    text = resources.files("proxy.gate").joinpath(portable.SCHEMAS_FILE).read_text("utf-8")
    assert json.loads(text) == json.loads(SHIPPED.read_text(encoding="utf-8"))


def test_extract_follows_refs() -> None:
    spec = {
        "info": {"version": "v"},
        "components": {
            "schemas": {
                "A": {"properties": {"b": {"$ref": "#/components/schemas/B"}}},
                "B": {"anyOf": [{"$ref": "#/components/schemas/C"}]},
                "C": {"type": "string"},
                "D": {"type": "null"},
            }
        },
    }
    assert list(extract(spec, ("A",))["components"]["schemas"]) == ["A", "B", "C"]


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SPEC
    document = extract(json.loads(source.read_text(encoding="utf-8")))
    SHIPPED.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", "utf-8")
