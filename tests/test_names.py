"""Names that say one thing: no two modules of `proxy/` define a class of the same name, private
ones included (a `Tally` of violations and a `Tally` of a report's rows read alike in a trace,
an import or a review, and are not)."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parent.parent / "proxy"


def shared_names(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Each class name defined in more than one place of `sources` (module name → text), with
    every place as `module:line`; a name defined twice in one module counts too."""
    places: dict[str, list[str]] = defaultdict(list)
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                places[node.name].append(f"{module}:{node.lineno}")
    return {name: found for name, found in sorted(places.items()) if len(found) > 1}


def modules(paths: Iterable[Path]) -> dict[str, str]:
    return {
        ".".join(path.relative_to(PROXY.parent).with_suffix("").parts): path.read_text(
            encoding="utf-8"
        )
        for path in paths
    }


def test_no_two_classes_share_a_name() -> None:
    shared = shared_names(modules(sorted(PROXY.rglob("*.py"))))
    assert not shared, "\n".join(f"{name}: {', '.join(at)}" for name, at in shared.items())


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        pytest.param({"a": "class A: ...\n", "b": "class B: ...\n"}, {}, id="distinct"),
        pytest.param(
            {"a": "class Tally: ...\n", "b": "x = 1\n\nclass Tally: ...\n"},
            {"Tally": ["a:1", "b:3"]},
            id="two-modules",
        ),
        pytest.param(
            {"a": "class _Parser: ...\n", "b": "def f():\n    class _Parser: ...\n"},
            {"_Parser": ["a:1", "b:2"]},
            id="private-and-nested",
        ),
        pytest.param({"a": "class A:\n    class A: ...\n"}, {"A": ["a:1", "a:2"]}, id="one-module"),
    ],
)
def test_shared_names(sources: dict[str, str], expected: dict[str, list[str]]) -> None:
    assert shared_names(sources) == expected
