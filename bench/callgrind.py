"""Servers counted by callgrind: started under valgrind with counting off until they listen,
and their user-space instructions read back dump by dump (`callgrind_control`).

Two runs of the same code agree within about 2 %, where CPU time on a shared machine drifts by
more than the changes worth measuring (docs/performance.md). The kernel's share (the socket
calls) is left out. Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import yaml
from servers import Server, free_port, started
from workload import GATE_CONFIG

BENCH = Path(__file__).resolve().parent


class Counted:
    """A server under callgrind; each `dump()` returns the instructions it executed since the
    last one (or since it listened), and callgrind starts counting afresh."""

    def __init__(self, server: Server, out: Path) -> None:
        self.server = server
        self._out = out
        self._dumps = 0
        self.last = out  # the latest dump's file

    def zero(self) -> None:
        control(self.server.pid, "--zero")

    def dump(self) -> float:
        control(self.server.pid, "--dump")
        # callgrind numbers its dumps OUT.1, OUT.2, ... in order.
        self._dumps += 1
        self.last = dumped(self._out.with_name(f"{self._out.name}.{self._dumps}"))
        return instructions(self.last)


@contextmanager
def counted_server(
    name: str,
    argv: list[str],
    directory: Path,
    log: IO[bytes],
    env: dict[str, str] | None = None,
) -> Iterator[Counted]:
    """Run `python argv... --port P` under callgrind (its dumps in `directory`), counting from
    the moment it listens; stopped (by PID) at the end."""
    port = free_port()
    out = directory / f"callgrind-{name.replace(' ', '-').replace('/', '_')}-{port}.out"
    wrapped = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    wrapped += [f"--callgrind-out-file={out}", sys.executable, *argv, "--port", str(port)]
    with started(name, wrapped, port, log, env, 300) as server:
        control(server.pid, "--instr=on")
        yield Counted(server, out)


def control(pid: int, option: str) -> None:
    """Tell the callgrind running process `pid` to `option` (`--instr=on`, `--zero`, `--dump`)."""
    subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, check=True)


def dumped(dump: Path) -> Path:
    """`dump` once callgrind has written it whole (its totals come last)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if dump.exists() and "totals:" in dump.read_text("utf-8")[-4096:]:
            return dump
        time.sleep(0.2)
    raise SystemExit(f"callgrind wrote no {dump.name} within 60 s")


def instructions(dump: Path) -> float:
    """The instructions a callgrind dump counted."""
    for line in dump.read_text("utf-8").splitlines():
        if line.startswith(("summary:", "totals:")):
            return float(line.split()[1])
    raise SystemExit(f"{dump}: no instruction count in the dump")


PASS = "pass-through"
FLOOR = "floor"
# A server's command: its argv after `python`, and what it adds to the environment.
Command = tuple[list[str], dict[str, str] | None]


def served_commands(
    directory: Path, upstream: str, trees: dict[str, Path | None], *, shortcut_off: bool = False
) -> dict[str, Command]:
    """The servers a comparison counts, by name, each in front of `upstream`: the pass-through
    (no parsing), the floor (strict parse, outputs paired, verdicts cached), and replay-proxy
    from each of `trees` (`trees.source_trees`) with the gate config of `workload.py` and an
    audit log in `directory`; with `shortcut_off`, each tree again with no session's prefix
    held (`limits.max_prefix_bytes: 0`: every body read in full)."""
    commands: dict[str, Command] = {
        PASS: ([str(BENCH / "passthrough.py"), "--upstream", upstream], None),
        FLOOR: ([str(BENCH / "floor.py"), "--upstream", upstream], None),
    }
    variants: list[tuple[str, dict[str, Any]]] = [("", {})]
    if shortcut_off:
        variants.append((", shortcut off", {"limits": {"max_prefix_bytes": 0}}))
    for name, path in trees.items():
        for suffix, extra in variants:
            index = len(commands)
            config = directory / f"proxy-{index}.yaml"
            audit = {"path": str(directory / f"audit-{index}.jsonl")}
            config.write_text(yaml.safe_dump({**GATE_CONFIG, **extra, "audit": audit}), "utf-8")
            argv = [*(["-P"] if path else []), "-m", "proxy", "serve", "--upstream", upstream]
            argv += ["--config", str(config), "--log-level", "WARNING"]
            commands[name + suffix] = (argv, {"PYTHONPATH": str(path)} if path else None)
    return commands
