"""bench/ is one harness and its workloads: a workload imports the harness, never another
workload, and serves nothing itself (the servers it measures against are the harness's)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"

# What the workloads share: the machine, the servers and how they are started and watched, the
# bodies and answers, wrk, the trees compared, the reports. Every other bench/*.py is a workload,
# a command of its own.
HARNESS = {
    "callgrind",  # servers counted by callgrind, dump by dump
    "client",  # aiohttp clients: answers checked, streams held and timed
    "floor",  # the minimal proxy: strict parse, outputs paired, verdicts cached
    "host",  # the machine, and the CPU others take
    "litellm_target",  # LiteLLM's proxy as a target of load.py
    "load_report",  # load.py's section of docs/performance.md
    "noop_processor",  # an ext_proc server that does nothing (started by envoy_load.py)
    "on_uvloop",  # runs a module on uvloop (a server's launcher)
    "passthrough",  # the bare aiohttp pass-through server
    "plan",  # the load benchmark's plans
    "processor",  # the External Processor driven in-process
    "report",  # medians, tables, sections of docs/performance.md
    "responses",  # the responses the ledger benchmarks record
    "servers",  # serving processes: started, watched, stopped by PID; the stub, redis
    "stub_upstream",  # the stub Open Responses upstream server
    "trees",  # replay-proxy source trees compared side by side
    "workload",  # request bodies and the gate config they meet
    "wrk",  # wrk runs and their scripts
}
# What only a server does: build an aiohttp app or site, run one, bind a socket.
SERVING = {"Application", "AppRunner", "TCPSite", "run_app", "bind"}


@functools.cache
def modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text("utf-8")) for path in BENCH.glob("*.py")}


def bench_imports(tree: ast.Module, names: set[str]) -> set[str]:
    """The bench modules `tree` imports, wherever the import stands."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return {name.split(".")[0] for name in found} & names


def runs_as_command(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
    )


def serves(tree: ast.Module) -> set[str]:
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return used & SERVING


WORKLOADS = sorted(set(modules()) - HARNESS)


def test_the_harness_is_there() -> None:
    assert sorted(HARNESS - set(modules())) == []


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_workload_is_a_command(name: str) -> None:
    """A module that is not a command belongs to the harness: name it in HARNESS."""
    assert runs_as_command(modules()[name]), f"bench/{name}.py: no `if __name__ == '__main__'`"


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_workload_imports_only_the_harness(name: str) -> None:
    every = modules()
    assert sorted(bench_imports(every[name], set(every)) - HARNESS) == []


@pytest.mark.parametrize("name", sorted(HARNESS))
def test_the_harness_imports_no_workload(name: str) -> None:
    every = modules()
    assert sorted(bench_imports(every[name], set(every)) - HARNESS) == []


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_workload_serves_nothing_itself(name: str) -> None:
    """Its servers are the harness's (servers.py starts them; stub_upstream.py is one)."""
    assert sorted(serves(modules()[name])) == []
