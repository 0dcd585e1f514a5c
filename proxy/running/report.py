"""The audit report: audit records read from files, summed into a `Summary`, rendered as text."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

# Spans up to this long are counted per hour, longer ones per day.
HOURLY_SPAN = timedelta(days=2)
# Past this many buckets the time series keeps only the buckets that have records.
MAX_FILLED_BUCKETS = 1000
TOP = 10
SAMPLE_IDS = 5
NONE = "(none)"
# The event of a record of the model's own calls (door 2): relayed as they came, never blocked.
EMITTED = "emitted_call_rejected"


@dataclass(frozen=True)
class Unreadable:
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


def iter_entries(name: str, lines: Iterable[bytes]) -> Iterator[Entry | Unreadable]:
    """Each line of an audit file (with its newline; the last may lack one) as a record or not."""
    for number, raw in enumerate(lines, 1):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        cut = "" if raw.endswith(b"\n") else " (no newline at the end: the record was cut short)"
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            yield Unreadable(name, number, ("blank line" if not line.strip() else "not JSON") + cut)
            continue
        if not isinstance(value, dict):
            yield Unreadable(name, number, "not a JSON object")
        elif not isinstance(value.get("findings"), list):
            yield Unreadable(name, number, "not an audit record: no findings array")
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
class Tally:
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
    """What the `log` records forwarded that `block` would have stopped."""

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
class Summary:
    """Everything the report shows, computed once from the records."""

    files: tuple[str, ...]
    records: int
    findings: int
    events: tuple[Tally, ...]
    reasons: tuple[Tally, ...]
    tools: tuple[Tally, ...]
    tenants: tuple[Tally, ...]
    upstreams: tuple[Tally, ...]
    actions: tuple[Tally, ...]
    request_paths: tuple[Tally, ...]
    first: datetime | None
    last: datetime | None
    bucket: str
    # Each bucket's start and its findings by reason, oldest first.
    timeline: tuple[tuple[datetime, tuple[tuple[str | None, int], ...]], ...]
    undated: int
    top_paths: tuple[tuple[str | None, str | None, str | None, int], ...]
    per_tool: tuple[ToolReport, ...]
    would_block: WouldBlock
    unreadable: tuple[Unreadable, ...]
    model_calls: ModelCalls


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

    def tallies(self) -> tuple[Tally, ...]:
        return tuple(
            Tally(k, self.requests[k], n) for k, n in _ranked(self.findings, self.requests)
        )


def _ranked(counts: Counter[Any], then: Counter[Any] | None = None) -> list[tuple[Any, int]]:
    """Most first; ties by the second count, then by the key as text (none last): a stable order."""
    second = then if then is not None else Counter()
    return sorted(
        counts.items(), key=lambda kv: (-kv[1], -second[kv[0]], kv[0] is None, str(kv[0]))
    )


def _floor(ts: datetime, bucket: str) -> datetime:
    if bucket == "hour":
        return ts.replace(minute=0, second=0, microsecond=0)
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def summarize(files: Iterable[str], entries: Iterable[Entry | Unreadable]) -> Summary:
    """Sum the records of the report; unreadable lines are kept to be shown, not counted."""
    records = 0
    unreadable: list[Unreadable] = []
    events, reasons, tools = _Counts(), _Counts(), _Counts()
    tenants, upstreams, actions, request_paths = _Counts(), _Counts(), _Counts(), _Counts()
    dated: list[tuple[datetime, list[str | None]]] = []
    undated = 0
    top_paths: Counter[tuple[str | None, str | None, str | None]] = Counter()
    tool_reasons: dict[str | None, Counter[str | None]] = {}
    tool_paths: dict[str | None, Counter[tuple[str | None, str | None]]] = {}
    blocked_requests = 0
    blocked_reasons: Counter[str | None] = Counter()
    blocked_tools: Counter[str | None] = Counter()
    # The latest log records, as a heap of (ts, order read, request_id): the oldest on top.
    blocked_ids: list[tuple[datetime, int, str | None]] = []
    emitted_responses = 0
    emitted_reasons: Counter[str | None] = Counter()
    emitted_tools: Counter[str | None] = Counter()
    for entry in entries:
        if isinstance(entry, Unreadable):
            unreadable.append(entry)
            continue
        rec = entry.record
        records += 1
        found = [f for f in rec["findings"] if isinstance(f, dict)]
        found_reasons = [key(f.get("reason")) for f in found]
        found_tools = [key(f.get("name")) for f in found]
        for counts, field_ in (
            (events, "event"),
            (tenants, "tenant"),
            (upstreams, "upstream"),
            (actions, "action"),
            (request_paths, "path"),
        ):
            counts.add_record(key(rec.get(field_)), len(found))
        reasons.add(found_reasons)
        tools.add(found_tools)
        for f, reason, tool in zip(found, found_reasons, found_tools, strict=True):
            tool_reasons.setdefault(tool, Counter())[reason] += 1
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
        if rec.get("event") == EMITTED:
            # Door 2 only watches: `block` would not have stopped these answers either.
            emitted_responses += 1
            emitted_reasons.update(found_reasons)
            emitted_tools.update(found_tools)
        elif rec.get("action") == "log":
            blocked_requests += 1
            blocked_reasons.update(found_reasons)
            blocked_tools.update(found_tools)
            latest = (ts or datetime.min.replace(tzinfo=UTC), records, key(rec.get("request_id")))
            if len(blocked_ids) < SAMPLE_IDS:
                heapq.heappush(blocked_ids, latest)
            else:
                heapq.heappushpop(blocked_ids, latest)
    first = min((ts for ts, _ in dated), default=None)
    last = max((ts for ts, _ in dated), default=None)
    bucket = "hour" if first is None or last is None or last - first <= HOURLY_SPAN else "day"
    per_bucket: dict[datetime, Counter[str | None]] = {}
    for ts, found_reasons in dated:
        per_bucket.setdefault(_floor(ts, bucket), Counter()).update(found_reasons)
    if first is not None and last is not None:
        step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
        start, end = _floor(first, bucket), _floor(last, bucket)
        if (end - start) / step < MAX_FILLED_BUCKETS:
            while start <= end:
                per_bucket.setdefault(start, Counter())
                start += step
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
    return Summary(
        files=tuple(files),
        records=records,
        findings=sum(reasons.findings.values()),
        events=events.tallies(),
        reasons=reasons.tallies(),
        tools=tools.tallies(),
        tenants=tenants.tallies(),
        upstreams=upstreams.tallies(),
        actions=actions.tallies(),
        request_paths=request_paths.tallies(),
        first=first,
        last=last,
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
    )


def iso(ts: datetime) -> str:
    return ts.isoformat(timespec="seconds").replace("+00:00", "Z")


def bucket_label(start: datetime, bucket: str) -> str:
    return start.strftime("%Y-%m-%d %H:00") if bucket == "hour" else start.strftime("%Y-%m-%d")


def _table(title: str, rows: Iterable[Tally]) -> Iterator[str]:
    rows = list(rows)
    width = max([len(title), *(len(shown(r.key)) for r in rows)])
    yield f"{title:<{width}}  requests  findings"
    for r in rows:
        yield f"{shown(r.key):<{width}}  {r.requests:>8}  {r.findings:>8}"
    yield ""


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
    if summary.undated:
        out.append(f"{summary.undated} record(s) without a readable ts: not in the time counts")
    for u in summary.unreadable:
        out.append(f"unreadable: {u.file}:{u.line}: {u.reason}")
    out.append("")
    out.extend(_table("event", summary.events))
    out.extend(_table("reason", summary.reasons))
    out.extend(_table("tool", summary.tools))
    out.extend(_table("tenant", summary.tenants))
    out.extend(_table("upstream", summary.upstreams))
    out.extend(_table("action", summary.actions))
    out.extend(_table("path", summary.request_paths))
    if summary.timeline:
        out.append(f"findings per {summary.bucket} (UTC)")
        for start, counts in summary.timeline:
            total = sum(n for _, n in counts)
            detail = ", ".join(f"{shown(r)} {n}" for r, n in counts)
            out.append(f"{bucket_label(start, summary.bucket)}  {total:>6}  {detail}".rstrip())
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
