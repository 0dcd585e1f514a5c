"""Imports point down: the pure layers load in a fresh interpreter without the HTTP stack, and
each package imports only the packages below it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HTTP_STACK = ["aiohttp", "multidict", "yarl", "redis"]

# The Envoy front's stack: the HTTP front and the transport-free layers never load it.
ENVOY_STACK = ["grpc", "envoy"]
# What only the pure core's checks need, and the config file's reader.
CHECKS = ["jsonschema", "regex"]

PROBE = """
import importlib, json, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps(sorted(name for name in sys.modules if "." not in name)))
"""


def loaded(*modules: str) -> set[str]:
    """The top-level packages loaded once `modules` are imported, in a fresh interpreter: when
    none of them loads a package, each alone does not either (one probe serves a group)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
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
        pytest.param("proxy.gate.host", [*HTTP_STACK, "yaml"], id="host-check"),
        pytest.param("proxy.running.check", [*HTTP_STACK, "yaml"], id="check"),
        # What `check` reads is told apart by its shape: no schemas are needed for that.
        pytest.param(
            "proxy.running.documents", [*HTTP_STACK, "jsonschema", "yaml"], id="check-documents"
        ),
        # The audit report reads JSON lines: no HTTP, no schemas, no YAML.
        pytest.param("proxy.running.report_html", [*HTTP_STACK, "jsonschema", "yaml"], id="report"),
        pytest.param("proxy.running.audit_tail", [*HTTP_STACK, "jsonschema", "yaml"], id="tail"),
        pytest.param("proxy.config", HTTP_STACK, id="config"),
        # Settings sit below the gate: reading them loads no schema or pattern engine.
        pytest.param("proxy.settings", [*HTTP_STACK, "jsonschema", "yaml", "regex"], id="settings"),
        # The upstream hop needs its settings, not the gate.
        pytest.param("proxy.server.upstream", ["jsonschema", "regex", "yaml"], id="upstream"),
        # The pipeline every front calls: a third front must not need the first two's stack.
        pytest.param("proxy.admission.pipeline", HTTP_STACK, id="admission"),
        # The third front: gRPC and the Envoy protos, never the HTTP front's stack.
        pytest.param("proxy.extproc.service", HTTP_STACK, id="extproc"),
        # Who a client is, read by every front: no HTTP stack to read a credential.
        pytest.param("proxy.admission.tenants", HTTP_STACK, id="tenants"),
        # `replay-proxy check` must not pay for the server it does not run.
        pytest.param("proxy.running.cli", HTTP_STACK, id="cli"),
    ],
)
def test_pure_layer_does_not_load(module: str, forbidden: list[str]) -> None:
    modules = loaded(module)
    assert module.split(".")[0] in modules
    assert modules.isdisjoint(forbidden), sorted(modules & set(forbidden))


# The modules of the one exchange and what it stands on, a group to a probe (the same forbidden
# packages): a row fails naming what its group loaded; import its modules one by one to see which.
@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        # Plain values: findings' words, pins, an access line, a credential, what the ledger
        # keeps and how, its view for the gate, the arguments comparator.
        pytest.param(
            [
                "proxy.gate.reasons",
                "proxy.gate.pins",
                "proxy.admission.access",
                "proxy.admission.credentials",
                "proxy.state.recording",
                "proxy.state.encoding",
                "proxy.state.ledger_view",
                "proxy.state.arguments",
            ],
            [*HTTP_STACK, *ENVOY_STACK, *CHECKS, "yaml"],
            id="values",
        ),
        # The findings' renderings, the dialect seam, the config's review: the core, no stack.
        pytest.param(
            [
                "proxy.gate.findings",
                "proxy.gate.records",
                "proxy.gate.phrases",
                "proxy.admission.dialect",
                "proxy.running.config_review",
            ],
            [*HTTP_STACK, *ENVOY_STACK, "yaml"],
            id="core",
        ),
        # The exchange and the services it is handed: free of every front's transport.
        pytest.param(
            ["proxy.admission.exchange", "proxy.admission.services"],
            [*HTTP_STACK, *ENVOY_STACK, "yaml"],
            id="exchange",
        ),
        # The HTTP front does not load the Envoy front's stack, nor the Envoy front aiohttp's.
        pytest.param(
            ["proxy.server.app", "proxy.server.forward", "proxy.server.websocket"],
            [*ENVOY_STACK, "yaml"],
            id="http-front",
        ),
        pytest.param(["proxy.extproc.exchange"], [*HTTP_STACK, "yaml"], id="envoy-front"),
        # The reference page is generated from the config's meanings and the metrics' help.
        pytest.param(["proxy.running.reference"], HTTP_STACK, id="reference"),
    ],
)
def test_group_does_not_load(modules: list[str], forbidden: list[str]) -> None:
    found = loaded(*modules)
    assert "proxy" in found
    assert found.isdisjoint(forbidden), sorted(found & set(forbidden))


def test_probe_sees_what_is_loaded() -> None:
    # The probe itself must be able to fail: aiohttp is found when it is imported.
    assert "aiohttp" in loaded("aiohttp")


# Which packages of ours each package may import: imports point down only (DESIGN.md, "Layers").
PROXY = Path(__file__).resolve().parent.parent / "proxy"
LAYERS: dict[str, frozenset[str]] = {
    "proxy.gate": frozenset({"proxy.gate"}),
    "proxy.settings": frozenset(),
    "proxy.config": frozenset({"proxy.gate", "proxy.settings"}),
    "proxy.state": frozenset({"proxy.state", "proxy.gate", "proxy.settings"}),
    "proxy.admission": frozenset(
        {"proxy.admission", "proxy.state", "proxy.gate", "proxy.settings", "proxy.config"}
    ),
    "proxy.server": frozenset(
        {
            "proxy.server",
            "proxy.admission",
            "proxy.state",
            "proxy.gate",
            "proxy.settings",
            "proxy.config",
        }
    ),
    "proxy.extproc": frozenset(
        {
            "proxy.extproc",
            "proxy.admission",
            "proxy.state",
            "proxy.gate",
            "proxy.settings",
            "proxy.config",
        }
    ),
    "proxy.running": frozenset(
        {
            "proxy.running",
            "proxy.extproc",
            "proxy.server",
            "proxy.admission",
            "proxy.state",
            "proxy.gate",
            "proxy.settings",
            "proxy.config",
        }
    ),
    "proxy.__main__": frozenset({"proxy.running"}),
    "proxy": frozenset(),  # proxy/__init__.py
}


def layer_of(module: str) -> str | None:
    """The row of LAYERS a module of ours belongs to: the longest name it starts with."""
    rows = [row for row in LAYERS if module == row or module.startswith(row + ".")]
    return max(rows, key=len) if rows else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PROXY.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = PROXY.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_of(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, module of ours) for every import in the source, in functions too."""
    package = module if module.count(".") < 1 else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "proxy":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "proxy":
                continue
            for alias in node.names:
                # `from proxy.state import ledger` imports the module proxy.state.ledger.
                name = f"{base}.{alias.name}"
                yield node.lineno, name if is_module(name) else base


def offending_imports(source: str, module: str) -> list[str]:
    """Each import of `module` that its row of LAYERS does not allow, as `module:line imports X`."""
    row = layer_of(module)
    allowed = LAYERS[row] if row is not None else frozenset()
    found = []
    for line, imported in imports_of(source, module):
        target = layer_of(imported)
        if target is None or target not in allowed:
            found.append(f"{module}:{line} imports {imported}")
    return found


MODULES = sorted(PROXY.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_module_sits_in_a_layer(path: Path) -> None:
    assert layer_of(module_name(path)) is not None, f"{module_name(path)}: in no row of LAYERS"


@pytest.mark.parametrize("row", list(LAYERS))
def test_layer_imports_only_what_it_may(row: str) -> None:
    offending = [
        found
        for path in MODULES
        if layer_of(module_name(path)) == row
        for found in offending_imports(path.read_text(encoding="utf-8"), module_name(path))
    ]
    assert not offending, offending


# The fronts: each translates between its wire and the exchange, and none imports another (the
# HTTP front's modules import each other; a fourth front goes beside these).
FRONTS = ("proxy.server", "proxy.extproc")


def front_of(module: str) -> str | None:
    return next((f for f in FRONTS if module == f or module.startswith(f + ".")), None)


def imports_of_other_fronts(source: str, module: str) -> list[str]:
    """Each import of `module` (a front's) from another front, as `module:line imports X`."""
    front = front_of(module)
    return [
        f"{module}:{line} imports {imported}"
        for line, imported in imports_of(source, module)
        if front_of(imported) not in (None, front)
    ]


FRONT_MODULES = [p for p in MODULES if front_of(module_name(p)) is not None]


@pytest.mark.parametrize("path", FRONT_MODULES, ids=[module_name(p) for p in FRONT_MODULES])
def test_no_front_imports_another(path: Path) -> None:
    module = module_name(path)
    assert not imports_of_other_fronts(path.read_text(encoding="utf-8"), module)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        pytest.param("proxy.server.forward", "from proxy.server import upstream\n", [], id="own"),
        pytest.param(
            "proxy.server.app",
            "from proxy.admission.exchange import Exchange\n",
            [],
            id="exchange",
        ),
        pytest.param(
            "proxy.server.websocket",
            "from proxy.extproc import exchange\n",
            ["proxy.server.websocket:1 imports proxy.extproc.exchange"],
            id="http-imports-envoy",
        ),
        pytest.param(
            "proxy.extproc.service",
            "def f():\n    from ..server.forward import relay\n",
            ["proxy.extproc.service:2 imports proxy.server.forward"],
            id="envoy-imports-http",
        ),
    ],
)
def test_imports_of_other_fronts(module: str, source: str, expected: list[str]) -> None:
    assert imports_of_other_fronts(source, module) == expected


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        pytest.param("proxy.gate.items", "import json\n", [], id="stdlib"),
        pytest.param("proxy.gate.verdict", "from proxy.gate import items\n", [], id="own-package"),
        pytest.param(
            "proxy.gate.items",
            "from proxy.state import ledger\n",
            ["proxy.gate.items:1 imports proxy.state.ledger"],
            id="core-imports-state",
        ),
        pytest.param(
            "proxy.gate.items",
            "def f():\n    from proxy.server.app import make_app\n",
            ["proxy.gate.items:2 imports proxy.server.app"],
            id="in-a-function",
        ),
        pytest.param(
            "proxy.settings",
            "from proxy import gate\n",
            ["proxy.settings:1 imports proxy.gate"],
            id="settings-import-gate",
        ),
        pytest.param(
            "proxy.server.upstream",
            "from proxy.running import cli\n",
            ["proxy.server.upstream:1 imports proxy.running.cli"],
            id="front-imports-running",
        ),
        pytest.param("proxy.running.cli", "from proxy.server import app\n", [], id="running"),
        pytest.param(
            "proxy.extproc.exchange",
            "from proxy.server import forward\n",
            ["proxy.extproc.exchange:1 imports proxy.server.forward"],
            id="front-imports-front",
        ),
        pytest.param(
            "proxy.admission.exchange",
            "from proxy.server.forward import relay\n",
            ["proxy.admission.exchange:1 imports proxy.server.forward"],
            id="exchange-imports-front",
        ),
        pytest.param(
            "proxy.admission.tap",
            "from . import body\nfrom ..server import app\n",
            ["proxy.admission.tap:2 imports proxy.server.app"],
            id="relative",
        ),
        pytest.param(
            "proxy.state.audit",
            "import proxy.flat\n",
            ["proxy.state.audit:1 imports proxy.flat"],
            id="unknown-module",
        ),
    ],
)
def test_offending_imports(module: str, source: str, expected: list[str]) -> None:
    assert offending_imports(source, module) == expected
