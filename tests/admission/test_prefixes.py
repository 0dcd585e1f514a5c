"""The prefix shortcut (`proxy.admission.prefixes`): a body that extends one its session passed
is read and judged only past it, and what admission decides is always what a full read decides.

The property: over generated stateless sessions (new pairs, failing calls, orphans, outputs
answering an old call, call ids reused, edits anywhere in the history, re-serialised histories,
duplicate keys placed across the cut, top-level members moved around it, calls replayed without
their status and judged by what the ledger recorded of them, the ledger recording an old call
again between turns), admission with the shortcut answers every turn exactly as admission that
reads every body in full.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.admission import body, pipeline, prefixes
from proxy.admission.chat import ChatCompletions
from proxy.admission.completions import completion_of
from proxy.admission.dialect import OpenResponses, dialect_of
from proxy.admission.routing import RouteCaches
from proxy.admission.tenants import ledger_key
from proxy.config import DEFAULT_UPSTREAM, Config
from proxy.running.config_file import parse_config
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger, LedgerFault
from proxy.state.metrics import Metrics
from proxy.state.stores import MemoryStore
from tests.builders import SALES_SCHEMA, SALES_TOOL, USER, sales_call, sales_output
from tests.gate.test_families import FAMILIES

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

    def __init__(self, config: Config, tmp: Path, name: str, path: str = "/v1/responses") -> None:
        self.config = config
        self.path = path
        self.caches = RouteCaches(config)
        self.ledger = Ledger(
            MemoryStore(max_responses=100, ttl_s=600), max_chain=8, fail_open=False
        )
        self.audit_log = AuditLog(str(tmp / f"{name}.jsonl"))
        self.metrics = Metrics()

    async def admit(self, raw: bytes, request_id: str) -> tuple[Any, ...]:
        dialect = dialect_of(self.path)
        request = pipeline.Request(raw, self.path, "http", request_id, TENANT, dialect=dialect)
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


def config_of(
    max_prefix_bytes: int, gate: dict[str, Any] | None = None, vendor: str | None = None
) -> Config:
    """A config holding at most `max_prefix_bytes` a session; its one upstream of `vendor`
    (whose vocabulary then judges every kind of item), or of none."""
    limits = {"max_prefix_bytes": max_prefix_bytes, "max_prefix_sessions": 4}
    if vendor is None:
        return parse_config({"gate": gate or {}, "limits": limits})
    upstreams = {vendor: {"url": "http://127.0.0.1:1", "vendor": vendor}}
    routes = [{"upstream": vendor}]
    return parse_config(
        {"gate": gate or {}, "limits": limits, "upstreams": upstreams, "routes": routes}
    )


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
    "pair without status",
    "recorded pair without status",
    "old call recorded again",
    "hosted call",
    "pair of another kind",
    "output of another kind answers an old call",
)
TENANT = "t_alice"
# The call and output families other than function calls whose items pair by call id alone.
OTHER_PAIRS = ("computer_call", "local_shell_call", "shell_call", "apply_patch_call")


@dataclass(frozen=True)
class Emitted:
    """Between two turns: an upstream response emitting `call` is recorded for the tenant."""

    call: dict[str, Any]
    serial: str

    @property
    def response(self) -> dict[str, Any]:
        return {"object": "response", "id": f"resp_{self.serial}", "output": [self.call]}


def other_pair(family: str, call_id: str, status: str) -> list[Any]:
    """A call of `family` (`test_families`'s) and its output, under `call_id`."""
    call, output = json.loads(json.dumps(FAMILIES[family]).replace('"k1"', f'"{call_id}"'))
    if "id" in call:
        call["id"] = f"{call['id']}_{call_id}"
    if "status" in call:
        call["status"] = status
    return [call, output]


def without_status(call: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in call.items() if k != "status"}


def iter_turns(draw: Any) -> Iterator[bytes | Emitted]:
    """The bodies of one generated session, turn after turn, and what the ledger records
    between them."""
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
        elif step in ("pair without status", "recorded pair without status"):
            if step.startswith("recorded"):
                status = draw(st.sampled_from(["completed", "incomplete"]))
                yield Emitted(sales_call(fresh, status=status), fresh)
            new = [without_status(sales_call(fresh)), sales_output(fresh)]
        elif step == "hosted call":
            action = {"type": "search", "query": "apac sales"}
            new = [{"type": "web_search_call", "id": f"ws_{serial}", "status": "completed"}]
            new[0]["action"] = action
        elif step == "pair of another kind":
            status = draw(st.sampled_from(["completed", "completed", "in_progress"]))
            new = other_pair(draw(st.sampled_from(OTHER_PAIRS)), fresh, status)
        elif step == "output of another kind answers an old call" and old_ids:
            old = draw(st.sampled_from(old_ids))
            new = other_pair(draw(st.sampled_from(OTHER_PAIRS)), old, "completed")[1:]
        elif step == "old call recorded again":
            calls = [i for i in history if isinstance(i, dict) and i.get("type") == "function_call"]
            # Most often one replayed without its status: the ledger decides its verdict.
            unsettled = [c for c in calls if "status" not in c]
            calls = unsettled if unsettled and draw(st.booleans()) else calls
            if calls:
                status = draw(st.sampled_from(["completed", "incomplete"]))
                yield Emitted({**draw(st.sampled_from(calls)), "status": status}, f"{fresh}_again")
            new = [sales_call(fresh), sales_output(fresh)]
        yield raw if raw is not None else wire(history, new, **options)
        if raw is None and not {"between", "tail", "tools"} & options.keys():
            history += new


def _tail(tools_first: bool) -> str:
    return "]" if tools_first else "]," + '"tools":' + json.dumps([SALES_TOOL], separators=COMPACT)


# The generated sessions' examples: a session is a few turns, each admitted twice.
GENERATED = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def decide_alike(full: Admission, shortcut: Admission, turns: list[bytes | Emitted]) -> None:
    """Each turn admitted by both, every answer the same; what the ledger records between two
    turns recorded in both."""

    async def session() -> None:
        for n, turn in enumerate(turns):
            if isinstance(turn, Emitted):
                for admission in (full, shortcut):
                    await admission.ledger.record(
                        ledger_key(TENANT), turn.response, upstream=DEFAULT_UPSTREAM
                    )
                continue
            expected = await full.admit(turn, f"req_{n}")
            assert await shortcut.admit(turn, f"req_{n}") == expected, turn

    asyncio.run(session())


@pytest.mark.parametrize(
    ("gate", "vendor"),
    [
        ({"action": "block"}, None),
        ({"action": "strip"}, None),
        ({"action": "strip", "require_provenance": True}, None),
        ({"action": "block"}, "openai"),
    ],
    ids=["block", "strip", "provenance", "openai"],
)
@GENERATED
@given(data=st.data())
def test_the_shortcut_decides_as_a_full_read(
    data: Any, gate: dict[str, Any], vendor: str | None, tmp_path: Path
) -> None:
    shortcut = Admission(config_of(1 << 20, gate, vendor), tmp_path, "shortcut")
    full = Admission(config_of(0, gate, vendor), tmp_path, "full")
    turns = list(iter_turns(data.draw))

    decide_alike(full, shortcut, turns)


# -- Chat Completions: every call replayed without a status --------------------------------------

CHAT = "/v1/chat/completions"
CHAT_TOOLS = [
    {"type": "function", "function": {k: v for k, v in SALES_TOOL.items() if k != "type"}}
]
CHAT_STEPS = (
    "pair",
    "pair",
    "recorded pair",
    "recorded pair",
    "cut pair",
    "failing pair",
    "old call recorded again",
    "old call cut again",
    "orphan tool message",
    "edit the history",
    "message",
)


def chat_wire(messages: list[Any]) -> bytes:
    head = [{"role": "system", "content": INSTRUCTIONS}]
    return json.dumps(
        {"model": "m", "messages": head + messages, "tools": CHAT_TOOLS}, separators=COMPACT
    ).encode()


def chat_call(call_id: str, region: str = "apac") -> dict[str, Any]:
    arguments = json.dumps({"region": region})
    function = {"name": "get_latest_sales_report", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def chat_pair(call_id: str, region: str = "apac") -> list[Any]:
    assistant = {"role": "assistant", "content": None, "tool_calls": [chat_call(call_id, region)]}
    return [assistant, {"role": "tool", "tool_call_id": call_id, "content": "sales report"}]


def chat_emitted(call: dict[str, Any], finish_reason: str, serial: str) -> Emitted:
    """A completion relayed with `call` (cut when `finish_reason` is `length`), as recorded."""
    message = {"role": "assistant", "tool_calls": [call]}
    choice = {"message": message, "finish_reason": finish_reason}
    answer = {"object": "chat.completion", "choices": [choice]}
    completion = completion_of(answer)
    assert completion is not None
    return Emitted(completion.response["output"][0], serial)


def iter_chat_turns(draw: Any) -> Iterator[bytes | Emitted]:
    """A stateless Chat Completions session: every call a tool_calls entry (no status), judged
    by what the ledger recorded of it (a completion cut short records it `incomplete`)."""
    history: list[Any] = [{"role": "user", "content": "How did APAC do?"}]
    for serial in range(1, draw(st.integers(2, 7)) + 1):
        step = draw(st.sampled_from(CHAT_STEPS))
        fresh = f"call_{serial}"
        calls = [c for m in history if m.get("tool_calls") for c in m["tool_calls"]]
        new: list[Any] = chat_pair(fresh)
        if step in ("recorded pair", "cut pair"):
            reason = "length" if step == "cut pair" else "tool_calls"
            yield chat_emitted(chat_call(fresh), reason, fresh)
        elif step == "failing pair":
            new = chat_pair(fresh, "mars")
        elif step in ("old call recorded again", "old call cut again") and calls:
            reason = "length" if "cut" in step else "tool_calls"
            yield chat_emitted(draw(st.sampled_from(calls)), reason, f"{fresh}_again")
        elif step == "orphan tool message":
            new = [{"role": "tool", "tool_call_id": fresh, "content": "no call"}]
        elif step == "edit the history" and len(history) > 1:
            at = draw(st.integers(1, len(history) - 1))
            history[at] = {**history[at], "content": "edited"}
        elif step == "message":
            new = [{"role": "assistant", "content": "Looking."}]
        yield chat_wire(history + new)
        history += new


@pytest.mark.parametrize(
    "gate",
    [{"action": "block"}, {"action": "strip", "require_provenance": True}],
    ids=["block", "provenance"],
)
@GENERATED
@given(data=st.data())
def test_a_chat_session_with_calls_decides_as_a_full_read(
    data: Any, gate: dict[str, Any], tmp_path: Path
) -> None:
    shortcut = Admission(config_of(1 << 20, gate), tmp_path, "shortcut", CHAT)
    full = Admission(config_of(0, gate), tmp_path, "full", CHAT)
    turns = list(iter_chat_turns(data.draw))

    decide_alike(full, shortcut, turns)


def test_a_chat_session_with_calls_is_read_past_its_prefix_while_the_ledger_holds_the_same(
    tmp_path: Path, reads: list[int]
) -> None:
    admission = Admission(config_of(1 << 20), tmp_path, "a", CHAT)
    tenant = ledger_key(TENANT)
    first = [{"role": "user", "content": "How did APAC do?"}, *chat_pair("call_1")]
    turns = [chat_wire(first), chat_wire(first + chat_pair("call_2"))]
    turns.append(chat_wire(first + chat_pair("call_2") + chat_pair("call_3")))

    async def session() -> list[tuple[Any, ...]]:
        await admission.ledger.record(
            tenant, chat_emitted(chat_call("call_1"), "stop", "1").response
        )
        answers = [await admission.admit(turns[0], "r0"), await admission.admit(turns[1], "r1")]
        # Held: the body, its call ids, and the arguments the ledger relayed call_1 with.
        relayed = len(chat_call("call_1")["function"]["arguments"])
        assert admission.caches.prefixes.held() == [len(turns[1]) + len("call_1call_2") + relayed]
        # The ledger now holds call_1 relayed cut short too: the prefix's verdict no longer
        # stands, the body is read in full and refused.
        cut = chat_emitted(chat_call("call_1"), "length", "2")
        await admission.ledger.record(tenant, cut.response)
        return [*answers, await admission.admit(turns[2], "r2")]

    answers = asyncio.run(session())
    assert [a[:3] for a in answers[:2]] == [
        ("forward", turns[0], "forward"),
        ("forward", turns[1], "forward"),
    ]
    assert answers[2][:2] == ("answer", 400)
    assert '"reason": "status"' in answers[2][2]
    assert reads == [len(turns[0]), len(turns[2])]  # the second was read past its prefix


class FallingStore(MemoryStore):
    """A memory store whose reads fail once it is `down`, as Redis's do."""

    down = False

    async def lookup(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise LedgerFault("down")
        return await super().lookup(*args, **kwargs)


def test_a_ledger_down_when_a_prefix_asks_it_is_a_503_counted_once(tmp_path: Path) -> None:
    admission = Admission(config_of(1 << 20), tmp_path, "a", CHAT)
    store = FallingStore(max_responses=100, ttl_s=600)
    admission.ledger = Ledger(store, max_chain=8, fail_open=False)
    first = [{"role": "user", "content": "How did APAC do?"}, *chat_pair("call_1")]

    async def session() -> list[tuple[Any, ...]]:
        held = await admission.admit(chat_wire(first), "r0")
        store.down = True
        return [held, await admission.admit(chat_wire(first + chat_pair("call_2")), "r1")]

    held, refused = asyncio.run(session())
    assert held[0] == "forward"
    assert admission.caches.prefixes.held()  # the next turn extends it, and asks the ledger
    assert refused[:2] == ("answer", 503)
    assert "ledger_unavailable" in refused[2]
    assert admission.ledger.stats.faults == {"read": 1}


@pytest.mark.parametrize("recorded", ["stop", "length", None], ids=["completed", "cut", "never"])
def test_a_ledger_down_under_fail_open_decides_as_a_full_read(
    tmp_path: Path, recorded: str | None
) -> None:
    # With fail_open a store that cannot answer counts as holding nothing: the held prefix's
    # verdicts stand only if it held nothing of its calls either.
    first = [{"role": "user", "content": "How did APAC do?"}, *chat_pair("call_1")]
    turns = [chat_wire(first), chat_wire(first + chat_pair("call_2"))]
    answers = []
    faults = []
    for size in (1 << 20, 0):
        admission = Admission(config_of(size), tmp_path, f"a{size}", CHAT)
        store = FallingStore(max_responses=100, ttl_s=600)
        admission.ledger = Ledger(store, max_chain=8, fail_open=True)

        async def session(admission: Admission, store: FallingStore) -> list[tuple[Any, ...]]:
            if recorded is not None:
                relayed = chat_emitted(chat_call("call_1"), recorded, "1")
                await admission.ledger.record(ledger_key(TENANT), relayed.response)
            held = await admission.admit(turns[0], "r0")
            store.down = True
            return [held, await admission.admit(turns[1], "r1")]

        answers.append(asyncio.run(session(admission, store)))
        faults.append(admission.ledger.stats.faults)
    assert answers[0] == answers[1]
    # One request, one read of the store: its fault is counted once, held prefix or not.
    assert faults == [{"read": 1}, {"read": 1}]


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
    monkeypatch.setattr(ChatCompletions, "parse", staticmethod(counted))
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


WEB_SEARCH = {"type": "web_search_call", "id": "ws_2", "status": "completed"}


@pytest.mark.parametrize(
    "new",
    [
        *(
            pytest.param(other_pair(family, "call_2", "completed"), id=family)
            for family in OTHER_PAIRS
        ),
        pytest.param([WEB_SEARCH | {"action": {"type": "search", "query": "q"}}], id="web_search"),
    ],
)
@pytest.mark.parametrize("vendor", [None, "openai"])
def test_a_call_of_another_kind_is_read_past_the_prefix(
    tmp_path: Path, reads: list[int], new: list[Any], vendor: str | None
) -> None:
    admission = Admission(config_of(1 << 20, vendor=vendor), tmp_path, "a")
    first, second = wire(PAIR_1, []), wire(PAIR_1, new)
    answers = run(admission, first, second)
    assert [a[:3] for a in answers] == [
        ("forward", first, "forward"),
        ("forward", second, "forward"),
    ]
    assert reads == [len(first)]


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
