"""The audit report: audit records read from files, summed into a `Summary`, rendered as text."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy.admission.dialect import label_of

# The widths a time bucket may have, each with its name, narrowest first: the records' span
# takes the narrowest that draws it in at most MAX_BARS bars (a day past that).
LADDER = (
    (timedelta(seconds=1), "second"),
    (timedelta(seconds=5), "5 seconds"),
    (timedelta(seconds=15), "15 seconds"),
    (timedelta(minutes=1), "minute"),
    (timedelta(minutes=5), "5 minutes"),
    (timedelta(minutes=15), "15 minutes"),
    (timedelta(hours=1), "hour"),
    (timedelta(hours=6), "6 hours"),
    (timedelta(days=1), "day"),
)
MAX_BARS = 60
# Buckets are counted from the epoch (a midnight, UTC): a day's start at 00:00, an hour's at :00.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Past this many buckets the time series keeps only the buckets that have records.
MAX_FILLED_BUCKETS = 1000
TOP = 10
SAMPLE_IDS = 5
# Distinct finding messages kept as examples of each reason.
SAMPLE_MESSAGES = 3
# The records the HTML page lists (to find one by its request id), the newest kept.
MAX_LISTED = 10000
# The outcomes of `replay_proxy_requests_total` that are the gate's verdicts on a request.
JUDGED = ("forward", "strip", "rewrite", "block")
NONE = "(none)"
# The event of a record of the model's own calls (door 2): relayed as they came, never blocked.
EMITTED = "emitted_call_rejected"


@dataclass(frozen=True)
class UnreadableLine:
    """A line that is not an audit record: its file, its line number and why."""

    file: str
    line: int
    reason: str


@dataclass(frozen=True)
class Entry:
    """One audit record as read, with where it was read."""

    file: str
    line: int
    record: dict[str, Any]


def iter_entries(name: str, lines: Iterable[bytes]) -> Iterator[Entry | UnreadableLine]:
    """Each line of an audit file (with its newline; the last may lack one) as a record or not."""
    for number, raw in enumerate(lines, 1):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        cut = "" if raw.endswith(b"\n") else " (no newline at the end: the record was cut short)"
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            yield UnreadableLine(
                name, number, ("blank line" if not line.strip() else "not JSON") + cut
            )
            continue
        if not isinstance(value, dict):
            yield UnreadableLine(name, number, "not a JSON object")
        elif not isinstance(value.get("findings"), list):
            yield UnreadableLine(name, number, "not an audit record: no findings array")
        else:
            yield Entry(name, number, value)


def key(value: Any) -> str | None:
    """A record's value as a count's key: strings as they are, anything else as its JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def shown(value: str | None) -> str:
    return NONE if value is None else value


def printable(text: str) -> str:
    """`text` safe for a terminal: control characters (as in an escape sequence) escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def timestamp(value: Any) -> datetime | None:
    """A record's `ts` in UTC, or None when it has none that reads as an ISO 8601 time."""
    if not isinstance(value, str):
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


@dataclass(frozen=True)
class CountRow:
    """One row of a count: records (requests) that had at least one such finding, and findings."""

    key: str | None
    requests: int
    findings: int


@dataclass(frozen=True)
class ToolReport:
    """One tool: its findings by reason, and its failing argument paths with their keywords."""

    name: str | None
    requests: int
    findings: int
    reasons: tuple[tuple[str | None, int], ...]
    paths: tuple[tuple[str | None, str | None, int], ...]


@dataclass(frozen=True)
class WouldBlock:
    """What the `log` records forwarded that `block` would have stopped: the `replay_rejected`
    records with action `log` and at least one finding with a `reason`. A record's action is
    its request's outcome, so every finding of such a record had action `log`; under the
    default `gate.action: block` (no `gate.actions`) every reason blocks, and the request would
    have been answered 400. Door 2's records (`emitted_call_rejected`) are never counted."""

    requests: int
    findings: int
    reasons: tuple[tuple[str | None, int], ...]
    tools: tuple[tuple[str | None, int], ...]
    # The latest few, newest first.
    request_ids: tuple[str | None, ...]


@dataclass(frozen=True)
class ModelCalls:
    """The model's own calls that failed their schema (`emitted_call_rejected` records)."""

    responses: int
    calls: int
    reasons: tuple[tuple[str | None, int], ...]
    tools: tuple[tuple[str | None, int], ...]


@dataclass(frozen=True)
class JudgedRequests:
    """The requests the gate judged, from a saved scrape of `/-/metrics`: the samples of
    `replay_proxy_requests_total` on a gated route (not `passthrough`, not `any`) whose outcome
    is a verdict (forward, strip, rewrite, block), summed by outcome."""

    source: str
    outcomes: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    @property
    def blocked(self) -> int:
        return self.outcomes.get("block", 0)


def read_judged(source: str, text: str) -> JudgedRequests:
    """The requests judged that a Prometheus text scrape counts; ValueError when it is not one
    or counts none (a scrape of another service, or of a proxy that judged nothing yet)."""
    outcomes = dict.fromkeys(JUDGED, 0)
    found = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != "replay_proxy_requests_total":
                    continue
                found = True
                outcome, route = sample.labels.get("outcome"), sample.labels.get("route")
                if outcome in outcomes and route not in ("passthrough", "any"):
                    outcomes[outcome] += int(sample.value)
    except ValueError as exc:
        raise ValueError(f"not a Prometheus text scrape of /-/metrics: {exc}") from None
    if not found:
        raise ValueError("no replay_proxy_requests_total in it: not a scrape of /-/metrics")
    return JudgedRequests(source, outcomes)


@dataclass(frozen=True)
class Headline:
    """The figures at the top, from the `replay_rejected` records (one per request with
    findings) by their action; `would_block` is the `log` ones that `block` would have stopped
    (see WouldBlock)."""

    requests: int
    blocked: int
    stripped: int
    rewritten: int
    logged: int
    would_block: int


@dataclass(frozen=True)
class Summary:
    """Everything the report shows, computed once from the records."""

    files: tuple[str, ...]
    records: int
    findings: int
    events: tuple[CountRow, ...]
    reasons: tuple[CountRow, ...]
    tools: tuple[CountRow, ...]
    tenants: tuple[CountRow, ...]
    upstreams: tuple[CountRow, ...]
    actions: tuple[CountRow, ...]
    request_paths: tuple[CountRow, ...]
    # The proxy's dialect of each record (`responses`, `chat`), as its `path` says.
    dialects: tuple[CountRow, ...]
    first: datetime | None
    last: datetime | None
    # The width of a time bucket, and its name ("5 seconds", "hour").
    width: timedelta
    bucket: str
    # Each bucket's start and its findings by reason, oldest first.
    timeline: tuple[tuple[datetime, tuple[tuple[str | None, int], ...]], ...]
    undated: int
    top_paths: tuple[tuple[str | None, str | None, str | None, int], ...]
    per_tool: tuple[ToolReport, ...]
    would_block: WouldBlock
    unreadable: tuple[UnreadableLine, ...]
    model_calls: ModelCalls
    headline: Headline
    # Each reason's first few distinct finding messages, the reasons ranked as in `reasons`.
    samples: tuple[tuple[str | None, tuple[str, ...]], ...]
    # The newest MAX_LISTED records, oldest first (undated ones first), for the page's search.
    listed: tuple[Entry, ...]
    # Tenant fingerprint -> name, from the config's `tenants:`.
    tenant_names: Mapping[str, str] = field(default_factory=dict)
    judged: JudgedRequests | None = None

    def tenant(self, value: str | None) -> str:
        """A tenant as the report shows it: its name and fingerprint when it has a name."""
        name = self.tenant_names.get(value) if value is not None else None
        return shown(value) if name is None else f"{name} ({value})"


@dataclass
class _Counts:
    requests: Counter[str | None] = field(default_factory=Counter)
    findings: Counter[str | None] = field(default_factory=Counter)

    def add(self, keys: list[str | None]) -> None:
        self.findings.update(keys)
        self.requests.update(set(keys))

    def add_record(self, k: str | None, findings: int) -> None:
        self.requests[k] += 1
        self.findings[k] += findings

    def tallies(self) -> tuple[CountRow, ...]:
        return tuple(
            CountRow(k, self.requests[k], n) for k, n in _ranked(self.findings, self.requests)
        )


def _ranked(counts: Counter[Any], then: Counter[Any] | None = None) -> list[tuple[Any, int]]:
    """Most first; ties by the second count, then by the key as text (none last): a stable order."""
    second = then if then is not None else Counter()
    return sorted(
        counts.items(), key=lambda kv: (-kv[1], -second[kv[0]], kv[0] is None, str(kv[0]))
    )


def _floor(ts: datetime, width: timedelta) -> datetime:
    return ts - (ts - EPOCH) % width


def bucket_width(first: datetime, last: datetime) -> tuple[timedelta, str]:
    """The narrowest width of the ladder that counts `first`..`last` in at most MAX_BARS
    buckets; a day when none does."""
    for width, name in LADDER:
        if (_floor(last, width) - _floor(first, width)) // width < MAX_BARS:
            return width, name
    return LADDER[-1]


def summarize(
    files: Iterable[str],
    entries: Iterable[Entry | UnreadableLine],
    *,
    tenants: Mapping[str, str] | None = None,
    judged: JudgedRequests | None = None,
) -> Summary:
    """Sum the records of the report; unreadable lines are kept to be shown, not counted.
    `tenants` names fingerprints; `judged` is what a metrics scrape says was judged."""
    records = 0
    unreadable: list[UnreadableLine] = []
    events, reasons, tools = _Counts(), _Counts(), _Counts()
    tenant_counts, upstreams, actions, request_paths = _Counts(), _Counts(), _Counts(), _Counts()
    dialects = _Counts()
    dated: list[tuple[datetime, list[str | None]]] = []
    undated = 0
    top_paths: Counter[tuple[str | None, str | None, str | None]] = Counter()
    tool_reasons: dict[str | None, Counter[str | None]] = {}
    tool_paths: dict[str | None, Counter[tuple[str | None, str | None]]] = {}
    samples: dict[str | None, list[str]] = {}
    replay_actions: Counter[str | None] = Counter()
    blocked_requests = 0
    blocked_reasons: Counter[str | None] = Counter()
    blocked_tools: Counter[str | None] = Counter()
    # The latest log records, as a heap of (ts, order read, request_id): the oldest on top.
    blocked_ids: list[tuple[datetime, int, str | None]] = []
    # The newest records, as a heap of (ts, order read, entry): the oldest on top.
    listed: list[tuple[datetime, int, Entry]] = []
    emitted_responses = 0
    emitted_reasons: Counter[str | None] = Counter()
    emitted_tools: Counter[str | None] = Counter()
    for entry in entries:
        if isinstance(entry, UnreadableLine):
            unreadable.append(entry)
            continue
        rec = entry.record
        records += 1
        found = [f for f in rec["findings"] if isinstance(f, dict)]
        found_reasons = [key(f.get("reason")) for f in found]
        found_tools = [key(f.get("name")) for f in found]
        for counts, field_ in (
            (events, "event"),
            (tenant_counts, "tenant"),
            (upstreams, "upstream"),
            (actions, "action"),
            (request_paths, "path"),
        ):
            counts.add_record(key(rec.get(field_)), len(found))
        dialects.add_record(label_of(rec.get("path")), len(found))
        reasons.add(found_reasons)
        tools.add(found_tools)
        for f, reason, tool in zip(found, found_reasons, found_tools, strict=True):
            tool_reasons.setdefault(tool, Counter())[reason] += 1
            said = samples.setdefault(reason, [])
            message = f.get("message")
            if isinstance(message, str) and len(said) < SAMPLE_MESSAGES and message not in said:
                said.append(message)
            paths = tool_paths.setdefault(tool, Counter())
            # Other reasons' violations (not_portable's) are of an item, not of the arguments.
            for violation in (f.get("fail") or []) if reason == "arguments_schema" else []:
                if isinstance(violation, dict):
                    where = (key(violation.get("path")), key(violation.get("reason")))
                    paths[where] += 1
                    top_paths[(tool, *where)] += 1
        ts = timestamp(rec.get("ts"))
        if ts is None:
            undated += 1
        else:
            dated.append((ts, found_reasons))
        order = (ts or datetime.min.replace(tzinfo=UTC), records)
        if len(listed) < MAX_LISTED:
            heapq.heappush(listed, (*order, entry))
        else:
            heapq.heappushpop(listed, (*order, entry))
        if rec.get("event") == EMITTED:
            # Door 2 only watches: `block` would not have stopped these answers either.
            emitted_responses += 1
            emitted_reasons.update(found_reasons)
            emitted_tools.update(found_tools)
            continue
        replay_actions[key(rec.get("action"))] += 1
        if rec.get("action") == "log" and any(r is not None for r in found_reasons):
            blocked_requests += 1
            blocked_reasons.update(r for r in found_reasons if r is not None)
            blocked_tools.update(
                t for t, r in zip(found_tools, found_reasons, strict=True) if r is not None
            )
            latest = (*order, key(rec.get("request_id")))
            if len(blocked_ids) < SAMPLE_IDS:
                heapq.heappush(blocked_ids, latest)
            else:
                heapq.heappushpop(blocked_ids, latest)
    first = min((ts for ts, _ in dated), default=None)
    last = max((ts for ts, _ in dated), default=None)
    width, bucket = LADDER[0]
    if first is not None and last is not None:
        width, bucket = bucket_width(first, last)
    per_bucket: dict[datetime, Counter[str | None]] = {}
    for ts, found_reasons in dated:
        per_bucket.setdefault(_floor(ts, width), Counter()).update(found_reasons)
    if first is not None and last is not None:
        start, end = _floor(first, width), _floor(last, width)
        if (end - start) / width < MAX_FILLED_BUCKETS:
            while start <= end:
                per_bucket.setdefault(start, Counter())
                start += width
    timeline = tuple((start, tuple(_ranked(per_bucket[start]))) for start in sorted(per_bucket))
    per_tool = tuple(
        ToolReport(
            t.key,
            t.requests,
            t.findings,
            tuple(_ranked(tool_reasons.get(t.key, Counter()))),
            tuple((p, r, n) for (p, r), n in _ranked(tool_paths.get(t.key, Counter()))),
        )
        for t in tools.tallies()
    )
    reason_tallies = reasons.tallies()
    return Summary(
        files=tuple(files),
        records=records,
        findings=sum(reasons.findings.values()),
        events=events.tallies(),
        reasons=reason_tallies,
        tools=tools.tallies(),
        tenants=tenant_counts.tallies(),
        upstreams=upstreams.tallies(),
        actions=actions.tallies(),
        request_paths=request_paths.tallies(),
        dialects=dialects.tallies(),
        first=first,
        last=last,
        width=width,
        bucket=bucket,
        timeline=timeline,
        undated=undated,
        top_paths=tuple((t, p, r, n) for (t, p, r), n in _ranked(top_paths)[:TOP]),
        per_tool=per_tool,
        would_block=WouldBlock(
            requests=blocked_requests,
            findings=sum(blocked_reasons.values()),
            reasons=tuple(_ranked(blocked_reasons)),
            tools=tuple(_ranked(blocked_tools)),
            request_ids=tuple(i for _, _, i in sorted(blocked_ids, reverse=True)),
        ),
        unreadable=tuple(unreadable),
        model_calls=ModelCalls(
            responses=emitted_responses,
            calls=sum(emitted_reasons.values()),
            reasons=tuple(_ranked(emitted_reasons)),
            tools=tuple(_ranked(emitted_tools)),
        ),
        headline=Headline(
            requests=sum(replay_actions.values()),
            blocked=replay_actions["block"],
            stripped=replay_actions["strip"],
            rewritten=replay_actions["rewrite"],
            logged=replay_actions["log"],
            would_block=blocked_requests,
        ),
        samples=tuple((t.key, tuple(samples.get(t.key, ()))) for t in reason_tallies),
        listed=tuple(e for _, _, e in sorted(listed, key=lambda item: item[:2])),
        tenant_names=dict(tenants or {}),
        judged=judged,
    )


def find_records(entries: Iterable[Entry | UnreadableLine], request_id: str) -> Iterator[Entry]:
    """The records of one request id (a replay's and door 2's may share it), as read."""
    for entry in entries:
        if isinstance(entry, Entry) and entry.record.get("request_id") == request_id:
            yield entry


def iso(ts: datetime) -> str:
    return ts.isoformat(timespec="seconds").replace("+00:00", "Z")


def bucket_label(start: datetime, width: timedelta) -> str:
    """A bucket's start, as precise as its width: a day's date, an hour's minute, a second's."""
    if width >= timedelta(days=1):
        return start.strftime("%Y-%m-%d")
    if width >= timedelta(minutes=1):
        return start.strftime("%Y-%m-%d %H:%M")
    return start.strftime("%Y-%m-%d %H:%M:%S")


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "n/a"


def iter_headline(summary: Summary) -> Iterator[str]:
    """The headline figures as sentences: what the records count, and the rejection rate when
    a metrics scrape says how many requests were judged."""
    h = summary.headline
    yield (
        f"requests with findings: {h.requests} (blocked {h.blocked}, stripped {h.stripped}, "
        f"rewritten {h.rewritten}, logged {h.logged}; would have blocked in log mode: "
        f"{h.would_block})"
    )
    judged = summary.judged
    if judged is not None:
        yield (
            f"requests judged: {judged.total} (from {judged.source}); rejection rate "
            f"{percent(judged.blocked, judged.total)} ({judged.blocked} blocked)"
        )


def _table(
    title: str, rows: Iterable[CountRow], label: Callable[[str | None], str] = shown
) -> Iterator[str]:
    named = [(label(r.key), r) for r in rows]
    width = max([len(title), *(len(name) for name, _ in named)])
    yield f"{title:<{width}}  requests  findings"
    for name, r in named:
        yield f"{name:<{width}}  {r.requests:>8}  {r.findings:>8}"
    yield ""


def render_record(entry: Entry) -> str:
    """One record for `--request-id`: where it was read, then its JSON, indented (ASCII: no
    control character of a value reaches the terminal)."""
    return f"{entry.file}:{entry.line}\n{json.dumps(entry.record, indent=2)}\n"


def render_text(summary: Summary) -> str:
    """The report for a terminal: the span, counts per dimension, time, top tools and paths."""
    out: list[str] = []
    files = ", ".join(summary.files)
    out.append(
        f"audit report: {summary.records} records, {summary.findings} findings, "
        f"from {len(summary.files)} file(s): {files}"
    )
    if summary.first is not None and summary.last is not None:
        out.append(
            f"from {iso(summary.first)} to {iso(summary.last)}, counted per {summary.bucket} (UTC)"
        )
    out.extend(iter_headline(summary))
    if summary.undated:
        out.append(f"{summary.undated} record(s) without a readable ts: not in the time counts")
    for u in summary.unreadable:
        out.append(f"unreadable: {u.file}:{u.line}: {u.reason}")
    out.append("")
    out.extend(_table("event", summary.events))
    out.extend(_table("reason", summary.reasons))
    if any(said for _, said in summary.samples):
        out.append("sample messages by reason")
        for reason, said in summary.samples:
            out.extend(f"  {shown(reason)}: {message}" for message in said)
        out.append("")
    out.extend(_table("tool", summary.tools))
    out.extend(_table("tenant", summary.tenants, summary.tenant))
    out.extend(_table("upstream", summary.upstreams))
    out.extend(_table("action", summary.actions))
    out.extend(_table("dialect", summary.dialects))
    out.extend(_table("path", summary.request_paths))
    if summary.timeline:
        out.append(f"findings per {summary.bucket} (UTC)")
        for start, counts in summary.timeline:
            total = sum(n for _, n in counts)
            detail = ", ".join(f"{shown(r)} {n}" for r, n in counts)
            out.append(f"{bucket_label(start, summary.width)}  {total:>6}  {detail}".rstrip())
        out.append("")
    out.append("top failing tools")
    for t in [t for t in summary.tools if t.key is not None][:TOP]:
        out.append(f"  {shown(t.key)}: {t.findings} finding(s) in {t.requests} request(s)")
    out.append("")
    if summary.top_paths:
        out.append("top failing argument paths")
        for tool, path, reason, n in summary.top_paths:
            out.append(f"  {shown(tool)} {shown(path) or '/'} ({shown(reason)}): {n}")
        out.append("")
    wb = summary.would_block
    out.append("what `block` would have blocked (records with action log)")
    if wb.requests:
        out.append(f"  {wb.requests} request(s) forwarded with {wb.findings} finding(s)")
        out.append("  by reason: " + ", ".join(f"{shown(r)} {n}" for r, n in wb.reasons))
        out.append("  by tool: " + ", ".join(f"{shown(t)} {n}" for t, n in wb.tools))
        out.append("  latest: " + ", ".join(shown(i) for i in wb.request_ids))
    elif summary.model_calls.responses:
        out.append("  nothing: no replay has action log (the model's own calls below never are)")
    else:
        out.append("  nothing: no record has action log")
    mc = summary.model_calls
    if mc.responses:
        out.append("")
        out.append(
            f"the model's own calls that failed their schema ({EMITTED}, relayed as they came)"
        )
        out.append(f"  {mc.calls} call(s) in {mc.responses} response(s)")
        out.append("  by reason: " + ", ".join(f"{shown(r)} {n}" for r, n in mc.reasons))
        out.append("  by tool: " + ", ".join(f"{shown(t)} {n}" for t, n in mc.tools))
    # Tool names, paths and tenants come from clients: no escape sequence reaches the terminal.
    return "".join(printable(line) + "\n" for line in out)
