"""The prefix shortcut (`proxy.admission.prefixes`): a body that extends one its session passed
is read and judged only past it, and what admission decides is always what a full read decides.

The property: over generated stateless sessions (new pairs, failing calls, orphans, outputs
answering an old call, call ids reused, edits anywhere in the history, re-serialised histories,
duplicate keys placed across the cut, top-level members moved around it), admission with the
shortcut answers every turn exactly as admission that reads every body in full.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.admission import body, pipeline, prefixes
from proxy.admission.dialect import OpenResponses
from proxy.admission.routing import RouteCaches
from proxy.config import Config
from proxy.running.config_file import parse_config
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics
from proxy.state.stores import MemoryStore
from tests.builders import SALES_SCHEMA, SALES_TOOL, USER, sales_call, sales_output

# Long enough that every body's prefix is past `prefixes.ANCHOR`.
INSTRUCTIONS = "You are a sales assistant. " * 50
COMPACT = (",", ":")
SPACED = (", ", ": ")


def wire(
    old: list[Any],
    new: list[Any],
    *,
    sep: tuple[str, str] = COMPACT,
    tools_first: bool = False,
    between: str | None = None,
    tail: str = "",
    tools: list[Any] | None = None,
) -> bytes:
    """A body as a client writes it: its items `old` then `new`; `between` (if given) put
    between them in place of the comma, `tail` before the closing brace."""
    tools = [SALES_TOOL] if tools is None else tools
    comma, colon = sep
    head: dict[str, Any] = {"model": "m", "instructions": INSTRUCTIONS}
    if tools_first:
        head["tools"] = tools
    text = json.dumps(head, separators=sep)[:-1] + f'{comma}"input"{colon}['
    text += comma.join(json.dumps(item, separators=sep) for item in old)
    if new:
        text += (comma if old else "") if between is None else between
        text += comma.join(json.dumps(item, separators=sep) for item in new)
    text += "]"
    if not tools_first:
        text += f'{comma}"tools"{colon}' + json.dumps(tools, separators=sep)
    return (text + tail + "}").encode()


class Admission:
    """Admission under one config, with its caches (and so its held prefixes) kept."""

    def __init__(self, config: Config, tmp: Path, name: str) -> None:
        self.config = config
        self.caches = RouteCaches(config)
        self.ledger = Ledger(
            MemoryStore(max_responses=100, ttl_s=600), max_chain=8, fail_open=False
        )
        self.audit_log = AuditLog(str(tmp / f"{name}.jsonl"))
        self.metrics = Metrics()

    async def admit(self, raw: bytes, request_id: str) -> tuple[Any, ...]:
        request = pipeline.Request(raw, "/v1/responses", "http", request_id, "t_alice")
        decided = await pipeline.admit(
            request,
            self.config,
            ledger=self.ledger,
            audit_log=self.audit_log,
            metrics=self.metrics,
            caches=self.caches,
        )
        if isinstance(decided, pipeline.Answer):
            return ("answer", decided.status, json.dumps(decided.body, sort_keys=True))
        return (
            "forward",
            decided.data,
            decided.outcome,
            dict(decided.add_headers),
            decided.record,
            asdict(decided.context),
            decided.upstream,
        )


def config_of(max_prefix_bytes: int, gate: dict[str, Any] | None = None) -> Config:
    limits = {"max_prefix_bytes": max_prefix_bytes, "max_prefix_sessions": 4}
    return parse_config({"gate": gate or {}, "limits": limits})


# -- generated sessions -----------------------------------------------------------------------

# The tool's schema with `apac` no longer a region: the same length, so only the bytes tell.
NO_APAC = [
    {
        **SALES_TOOL,
        "parameters": {
            **SALES_SCHEMA,
            "properties": {"region": {"type": "string", "enum": ["xxxx", "emea", "amer"]}},
        },
    }
]
STEPS = (
    "pair",
    "pair",
    "pair",
    "pairs",
    "tools changed",
    "failing pair",
    "orphan output",
    "answers an old call",
    "reuses an old call id",
    "call without output",
    "message",
    "edit the history",
    "drop an old item",
    "re-serialise",
    "duplicate key in the tail",
    "duplicate input in the tail",
    "member added to the tail",
    "members moved into the middle",
    "duplicate key moved into the middle",
    "duplicate key in a new item",
    "not JSON after the cut",
    "item reference",
    "same body again",
)


def iter_turns(draw: Any) -> Iterator[bytes]:
    """The bodies of one generated session, turn after turn."""
    history: list[Any] = [USER]
    tools_first = draw(st.booleans())
    for serial in range(1, draw(st.integers(2, 7)) + 1):
        step = draw(st.sampled_from(STEPS))
        fresh = f"call_{serial}"
        old_ids = [i["call_id"] for i in history if isinstance(i, dict) and "call_id" in i]
        new: list[Any] = []
        options: dict[str, Any] = {"tools_first": tools_first}
        raw: bytes | None = None
        if step == "pair":
            new = [sales_call(fresh), sales_output(fresh)]
        elif step == "tools changed":
            options["tools"] = NO_APAC
            new = [sales_call(fresh, "emea"), sales_output(fresh)]
        elif step == "pairs":
            new = [sales_call(fresh), sales_output(fresh), sales_call(fresh + "b")]
            new += [sales_output(fresh + "b")]
        elif step == "failing pair":
            new = [sales_call(fresh, "mars"), sales_output(fresh)]
        elif step == "orphan output":
            new = [sales_output(fresh)]
        elif step == "answers an old call" and old_ids:
            new = [sales_output(draw(st.sampled_from(old_ids)))]
        elif step == "reuses an old call id" and old_ids:
            reused = draw(st.sampled_from(old_ids))
            new = [
                sales_call(reused, draw(st.sampled_from(["apac", "emea"]))),
                sales_output(reused),
            ]
        elif step == "call without output":
            new = [sales_call(fresh)]
        elif step == "message":
            new = [{"type": "message", "role": "assistant", "content": "Looking."}]
        elif step == "edit the history" and len(history) > 1:
            at = draw(st.integers(1, len(history) - 1))
            item = dict(history[at])
            if "arguments" in item:
                item["arguments"] = json.dumps({"region": draw(st.sampled_from(["emea", "mars"]))})
            else:
                item["output"] = "edited"
            history[at] = item
            new = [sales_call(fresh), sales_output(fresh)]
        elif step == "drop an old item" and len(history) > 1:
            del history[draw(st.integers(1, len(history) - 1))]
        elif step == "re-serialise":
            options["sep"] = SPACED
            new = [sales_call(fresh), sales_output(fresh)]
        elif step == "duplicate key in the tail":
            options["tail"] = ',"model":"m2"'
            new = [sales_call(fresh), sales_output(fresh)]
        elif step == "duplicate input in the tail":
            options["tail"] = ',"input":[]'
        elif step == "member added to the tail":
            options["tail"] = f',"metadata":{{"turn":"{serial}"}}'
            new = [sales_call(fresh), sales_output(fresh)]
        elif step in ("members moved into the middle", "duplicate key moved into the middle"):
            name = "model" if step.startswith("duplicate") else "note"
            options["between"] = f'],"{name}":"m","more":['
            new = [sales_call(fresh), sales_output(fresh)]
        elif step == "duplicate key in a new item":
            duplicated = json.dumps(sales_output(fresh))[:-1] + ', "output": "again"}'
            raw = wire(history, [], **options)[: -len(_tail(tools_first)) - 1]
            raw += ("," + json.dumps(sales_call(fresh)) + "," + duplicated).encode()
            raw += _tail(tools_first).encode() + b"}"
        elif step == "not JSON after the cut":
            raw = wire(history, [], **options)[: -len(_tail(tools_first)) - 1]
            raw += b',{"type":"message",]' + _tail(tools_first).encode()[1:] + b"}"
        elif step == "item reference":
            new = [{"type": "item_reference", "id": "msg_1"}]
        yield raw if raw is not None else wire(history, new, **options)
        if raw is None and not {"between", "tail", "tools"} & options.keys():
            history += new


def _tail(tools_first: bool) -> str:
    return "]" if tools_first else "]," + '"tools":' + json.dumps([SALES_TOOL], separators=COMPACT)


@pytest.mark.parametrize("action", ["block", "strip"])
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_shortcut_decides_as_a_full_read(data: Any, action: str, tmp_path: Path) -> None:
    gate = {"action": action}
    shortcut = Admission(config_of(1 << 20, gate), tmp_path, "shortcut")
    full = Admission(config_of(0, gate), tmp_path, "full")
    turns = list(iter_turns(data.draw))

    async def session() -> None:
        for n, raw in enumerate(turns):
            expected = await full.admit(raw, f"req_{n}")
            assert await shortcut.admit(raw, f"req_{n}") == expected, raw

    asyncio.run(session())


# -- the shortcut taken, and not taken ---------------------------------------------------------


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every body read in full."""
    sizes: list[int] = []
    parse = body.parse

    def counted(decoded: bytes) -> dict[str, Any]:
        sizes.append(len(decoded))
        return parse(decoded)

    monkeypatch.setattr(OpenResponses, "parse", staticmethod(counted))
    return sizes


def run(admission: Admission, *bodies: bytes) -> list[tuple[Any, ...]]:
    async def all_of() -> list[tuple[Any, ...]]:
        return [await admission.admit(raw, f"req_{n}") for n, raw in enumerate(bodies)]

    return asyncio.run(all_of())


PAIR_1 = [USER, sales_call("call_1"), sales_output("call_1")]
PAIR_2 = [sales_call("call_2"), sales_output("call_2")]


def test_an_extended_body_is_read_past_its_verified_prefix(
    tmp_path: Path, reads: list[int]
) -> None:
    admission = Admission(config_of(1 << 20), tmp_path, "a")
    first, second = wire(PAIR_1, []), wire(PAIR_1, PAIR_2)
    answers = run(admission, first, second, second)
    assert [a[:3] for a in answers] == [
        ("forward", first, "forward"),
        ("forward", second, "forward"),
        ("forward", second, "forward"),
    ]
    assert reads == [len(first)]  # the second and third were not read in full
    assert admission.caches.prefixes.held() == [len(second) + len("call_1call_2fc_call_1fc_call_2")]


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(wire([*PAIR_1[:2], sales_output("call_1", "edited")], PAIR_2), id="edited"),
        pytest.param(wire(PAIR_1, PAIR_2, sep=SPACED), id="re-serialised"),
        pytest.param(wire(PAIR_1, PAIR_2, tail=',"metadata":{}'), id="tail-changed"),
        pytest.param(wire(PAIR_1, [sales_output("call_1")]), id="answers-an-old-call"),
    ],
)
def test_a_body_that_does_not_extend_byte_for_byte_is_read_in_full(
    tmp_path: Path, reads: list[int], second: bytes
) -> None:
    admission = Admission(config_of(1 << 20), tmp_path, "a")
    run(admission, wire(PAIR_1, []), second)
    assert len(reads) == 2


def test_a_duplicate_key_after_the_cut_is_refused(tmp_path: Path) -> None:
    admission = Admission(config_of(1 << 20), tmp_path, "a")
    duplicated = wire(PAIR_1, PAIR_2, tail=',"model":"other"')
    moved = wire(PAIR_1, PAIR_2, between='],"model":"m","more":[')
    answers = run(admission, wire(PAIR_1, []), duplicated, moved)
    assert answers[1][:2] == ("answer", 400)
    assert "invalid_json" in answers[1][2]
    assert answers[2][:2] == ("answer", 400)
    assert "invalid_json" in answers[2][2]


def test_nothing_is_held_over_the_bound(tmp_path: Path, reads: list[int]) -> None:
    first = wire(PAIR_1, [])
    admission = Admission(config_of(len(first)), tmp_path, "a")
    run(admission, first, wire(PAIR_1, PAIR_2), wire(PAIR_1, [*PAIR_2, *PAIR_2]))
    assert len(reads) == 2  # the second was too long to be held
    assert admission.caches.prefixes.held() == []


def test_locate_finds_the_array_of_the_member() -> None:
    data = b'{"x":{"input":[1]},"input" : [ {"a":"]\\""} , 2 ] ,"z":[]}'
    cut, end = prefixes.locate(data, "input") or (0, 0)
    assert data[:cut].endswith(b", 2")
    assert data[end:] == b'] ,"z":[]}'
    assert prefixes.locate(b'{"input":[]}', "input") is None
    assert prefixes.locate(b'{"input":"text"}', "input") is None


@pytest.mark.parametrize(
    ("data", "located"),
    [
        # a later member nests a `]` followed by the next member's name: the members after it
        # would not read as those of the body
        (b'{"input":[1],"tools":[{"a":[2],"tools":3}]}', (11, 11)),
        (b'{"input":[1] , "tools":[[],"tools"],"z":{"q":[],"tools":1}}', (11, 11)),
        # an item nests one: found from the end, the array's own comes first
        (b'{"input":[1,{"a":[2],"tools":[]}],"tools":[]}', (32, 32)),
        (b'{"m":1,"input":[ 1 ]\n}', (18, 19)),
        # the member after it is written with its name escaped: not found, read in full
        (b'{"input":[1],"tool\\u0073":[]}', None),
    ],
    ids=["nested-in-tail", "nested-twice", "nested-in-item", "last-member", "escaped-name"],
)
def test_locate_tells_the_array_from_one_nested_after_it(
    data: bytes, located: tuple[int, int] | None
) -> None:
    assert prefixes.locate(data, "input") == located


# -- many sessions sharing their first bytes ---------------------------------------------------


def held_body(data: bytes, config: Config) -> prefixes.Verified:
    cut, end = prefixes.locate(data, "input") or (0, 0)
    return prefixes.Verified(data, cut, end, {}, frozenset(), (), "default", config.gate)


def test_each_of_many_sessions_sharing_their_first_bytes_finds_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sessions of one tenant with the same instructions and tools (the first 1,300 bytes of
    # every body), two by two asking the same question: each turn extends its own session's
    # body, found among hundreds held with a bounded number of tries, however many are held.
    config = config_of(1 << 20)
    held = prefixes.Prefixes(1 << 20, 1000)
    tried: list[int] = []
    extension = prefixes._extension

    def counted(verified: prefixes.Verified, serial: int, data: bytes) -> prefixes.Match | None:
        tried.append(serial)
        return extension(verified, serial, data)

    monkeypatch.setattr(prefixes, "_extension", counted)
    sessions = [[{"role": "user", "content": f"question {n % 300}"}] for n in range(600)]
    serials: list[int | None] = [None] * len(sessions)
    for turn in range(3):
        for n, history in enumerate(sessions):
            new = [sales_call(f"call_{n}_{turn}"), sales_output(f"call_{n}_{turn}")]
            tried.clear()
            found = held.match("t_alice", "/v1/responses", wire(history, new))
            if turn == 0:
                assert found is None  # nothing held for it yet
            else:
                assert found is not None
                assert found.serial == serials[n]
                assert json.loads(found.new) == new
            assert len(tried) <= 2 * prefixes.NEIGHBOURS
            history += new
            verified = held_body(wire(history, []), config)
            held.remember("t_alice", "/v1/responses", verified, serials[n])
            serials[n] = serials[n] or held._serial
    assert len(held.held()) == len(sessions)
