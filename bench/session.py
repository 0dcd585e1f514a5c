"""Instructions per turn of an agent session: the pass-through, the floor and replay-proxy,
each counted by callgrind (issue 26).

Run from the repository root: `python bench/session.py [--turns N] [--chat] [--base REV]
[--tree DIR]... [--keep DIR]` (needs valgrind; a few minutes at 200 turns). Two sessions, each
a request per turn sent one at a time over one keep-alive connection:

- *stateless*: every turn re-sends the whole history with one more function call and its
  output (`workload.iter_pairs`, as most clients and Codex with `store: false` do): turn t
  carries t pairs. Counted alone at turns 1, N/4, N/2, 3N/4 and N; *total* is every
  instruction the server executed from the first turn's request to the last one's answer.
- *previous_response_id*: each turn names the response before it and answers the call that
  response emitted (the stub upstream's `x-bench-call: ok`); its cost should not grow.
  Counted alone at turns N/4 and N.

With `--chat` the stateless session is sent as Chat Completions requests (the same history as
messages: each call an assistant message's `tool_calls`, each output a `role: "tool"` message,
`workload.chat_body`), and there is no previous_response_id session (the API has none). The
floor parses such a body and judges nothing in it (it reads `input` alone).

Each server runs under `valgrind --tool=callgrind` (`callgrind.py`), counting from when it
listens; a short warm-up session of its own (other arguments, other call ids) comes first. The
working tree is counted, beside the pass-through, the floor (`floor.py`), the tree at
`--base` if given, and each `--tree`. `--keep DIR` keeps the callgrind dump of each server's
last counted stateless turn there (read it with `callgrind_annotate`). All listen on
127.0.0.1 and are stopped (by PID) at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from callgrind import FLOOR, PASS, Counted, counted_server, served_commands
from host import describe
from servers import started_stub
from trees import source_trees
from workload import (
    CHAT_PATH,
    HEADERS,
    MODEL,
    PATH,
    TOOLS,
    chat_body,
    encode,
    iter_pairs,
    request_body,
)

WARM_TURNS = 5
STATELESS = "stateless"
CHAINED = "previous_response_id"
# What each session's row of targets asks (issue 26): turn N over turn 1, turn N over N/4.
LATE_OVER_FIRST = 3.0
CHAINED_FLAT = 1.1
TOTAL_G = 0.8


class Client:
    """One keep-alive connection to a server; every answer must be a 200."""

    def __init__(self, port: int, name: str) -> None:
        self.name = name
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def held(self) -> tuple[float, float] | None:
        """The stateless sessions replay-proxy holds a body of, and the bytes they hold
        (`/-/metrics`); None from a server that has no such gauges."""
        self.connection.request("GET", "/-/metrics")
        answer = self.connection.getresponse()
        text = answer.read().decode()
        found = {
            name: float(value)
            for name, value in re.findall(r"(?m)^replay_proxy_prefix_(\w+) (\S+)$", text)
        }
        if answer.status != 200 or "sessions" not in found:
            return None
        return found["sessions"], found["bytes"]

    def post(self, data: bytes, extra: dict[str, str] | None = None, path: str = PATH) -> bytes:
        self.connection.request("POST", path, data, HEADERS | (extra or {}))
        answer = self.connection.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise SystemExit(f"{self.name}: {answer.status} {body[:300]!r}")
        return body


def stateless_turns(turns: int, first: int = 0, chat: bool = False) -> Callable[[int], bytes]:
    """Turn t's request of a stateless session: the first t pairs of its history (as Chat
    Completions messages when `chat`)."""
    pairs = iter_pairs(turns, seed=first + 5, first=first)
    if chat:
        return lambda t: encode(chat_body(pairs[:t]))
    return lambda t: encode(request_body(pairs[:t]))


def chained_turn(answer: bytes | None) -> bytes:
    """The next turn of a previous_response_id session: the call the last answer emitted,
    answered (the first turn asks a question)."""
    if answer is None:
        return encode(request_body([]))
    response: dict[str, Any] = json.loads(answer)
    call = next(item for item in response["output"] if item["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "shipped"}
    return encode(
        {"model": MODEL, "previous_response_id": response["id"], "input": [output], "tools": TOOLS}
    )


def run_stateless(
    server: Counted,
    client: Client,
    turns: int,
    marks: list[int],
    keep: Path | None,
    chat: bool = False,
) -> dict[str, float]:
    """Instructions of each marked turn alone, and of the whole session (`total`)."""
    turn = stateless_turns(turns, chat=chat)
    path = CHAT_PATH if chat else PATH
    counted: dict[str, float] = {"total": 0.0}
    server.zero()
    for t in range(1, turns + 1):
        if t in marks:
            counted["total"] += server.dump()  # the turns before, since the last dump
            client.post(turn(t), path=path)
            counted[str(t)] = server.dump()
            counted["total"] += counted[str(t)]
            if keep is not None and t == marks[-1]:
                shutil.copy(server.last, keep / f"{server.server.name.replace(' ', '-')}.out")
        else:
            client.post(turn(t), path=path)
    counted["total"] += server.dump()
    return counted


def run_chained(server: Counted, client: Client, turns: int, marks: list[int]) -> dict[str, float]:
    """Instructions of each marked turn of a previous_response_id session, alone."""
    counted: dict[str, float] = {}
    answer = None
    for t in range(1, turns + 1):
        data = chained_turn(answer)
        if t in marks:
            server.zero()
            answer = client.post(data, {"x-bench-call": "ok"})
            counted[str(t)] = server.dump()
        else:
            answer = client.post(data, {"x-bench-call": "ok"})
    return counted


def warm_up(client: Client, chat: bool = False) -> None:
    """A short session of each kind whose arguments and call ids the counted ones never use."""
    turn = stateless_turns(WARM_TURNS, first=100_000, chat=chat)
    for t in range(1, WARM_TURNS + 1):
        client.post(turn(t), path=CHAT_PATH if chat else PATH)
    answer = None
    for _ in range(WARM_TURNS):
        answer = client.post(chained_turn(answer), {"x-bench-call": "ok"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200, help="of each session (at least 4)")
    parser.add_argument("--base", default=None, help="a revision to count too")
    parser.add_argument(
        "--tree", action="append", default=[], help="a directory holding a proxy package"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the late turns' dumps here")
    parser.add_argument(
        "--chat", action="store_true", help="a stateless Chat Completions session alone"
    )
    args = parser.parse_args()
    turns = max(4, args.turns)
    marks = sorted({1, *(turns * k // 4 for k in range(1, 5))})
    chained_marks = [] if args.chat else [turns // 4, turns]
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    results: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    held: dict[str, tuple[float, float] | None] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-session-")))
        log = stack.enter_context((tmp / "servers.log").open("wb"))
        trees = source_trees(tmp, args.base, None, args.tree)
        stub = stack.enter_context(started_stub(log))
        for name, (argv, env) in served_commands(tmp, stub.url, trees).items():
            with counted_server(name, argv, tmp, log, env) as server:
                client = Client(server.server.port, name)
                warm_up(client, args.chat)
                stateless = run_stateless(server, client, turns, marks, args.keep, args.chat)
                # Read after the stateless session (the warm-up's is held too): what the proxy
                # holds to recognise a session's prefix.
                held[name] = client.held() if name not in (PASS, FLOOR) else None
                chained = {} if args.chat else run_chained(server, client, turns, chained_marks)
                results[name] = (stateless, chained)
                client.connection.close()
    report(results, turns, marks, chained_marks, args.chat)
    for name, found in held.items():
        if found is not None:
            sessions, size = found
            per = size / sessions if sessions else 0.0
            print(  # noqa: T201
                f"\n{name} holds {sessions:.0f} stateless session(s) after the session, "
                f"{size / 1e3:,.1f} kB in all ({per / 1e3:,.1f} kB per session; bounded by "
                "limits.max_prefix_bytes per session and limits.max_prefix_sessions)."
            )
    return 0


def report(
    results: dict[str, tuple[dict[str, float], dict[str, float]]],
    turns: int,
    marks: list[int],
    chained_marks: list[int],
    chat: bool = False,
) -> None:
    names = list(results)
    proxies = [n for n in names if n not in (PASS, FLOOR)]
    out = [f"{describe()}; {turns} turns per session; thousands of user-space instructions"]
    sent = ", as Chat Completions messages" if chat else ""
    out += ["", f"Stateless session (turn t re-sends t pairs{sent}):", ""]
    out += [f"| turn | {' | '.join(names)} | " + " | ".join(f"{n} / pass" for n in proxies) + " |"]
    out += ["| :--- |" + " ---: |" * (len(names) + len(proxies))]
    for mark in [*map(str, marks), "total"]:
        of = {n: results[n][0][mark] for n in names}
        cells = [f"{of[n] / 1e3:,.0f}" for n in names]
        cells += [f"{of[n] / of[PASS]:.2f}x" for n in proxies]
        out.append(f"| {mark} | " + " | ".join(cells) + " |")
    if chained_marks:
        out += ["", f"{CHAINED} session (each turn names the previous response):", ""]
        out += [f"| turn | {' | '.join(names)} |", "| :--- |" + " ---: |" * len(names)]
    for mark in map(str, chained_marks):
        out.append(
            f"| {mark} | " + " | ".join(f"{results[n][1][mark] / 1e3:,.0f}" for n in names) + " |"
        )
    out += [
        "",
        "| target | goal | " + " | ".join(proxies) + " |",
        "| :--- | ---: |" + " ---: |" * len(proxies),
    ]
    first, last = str(marks[0]), str(marks[-1])
    rows: list[tuple[str, str, Callable[[str], str]]] = [
        (
            f"stateless: turn {last} / turn {first}",
            f"≤ {LATE_OVER_FIRST:g}x",
            lambda n: f"{results[n][0][last] / results[n][0][first]:.2f}x",
        ),
        (
            "stateless: session total",
            f"≤ {TOTAL_G:g} G (200 turns)",
            lambda n: f"{results[n][0]['total'] / 1e9:.3f} G",
        ),
    ]
    if chained_marks:
        c0, c1 = map(str, chained_marks)
        rows.append(
            (
                f"{CHAINED}: turn {c1} / turn {c0}",
                f"≤ {CHAINED_FLAT:g}x",
                lambda n: f"{results[n][1][c1] / results[n][1][c0]:.2f}x",
            )
        )
    for label, goal, value in rows:
        out.append(f"| {label} | {goal} | " + " | ".join(value(n) for n in proxies) + " |")
    print("\n".join(out))  # noqa: T201


if __name__ == "__main__":
    sys.exit(main())
