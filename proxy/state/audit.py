"""The audit log: its one record format, its hash-chained writer (a file or stdout), its check."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.gate.findings import Finding
from proxy.gate.values import value
from proxy.gate.verdict import MAX_FINDINGS, Verdict, listed

_OUTCOME_ACTION = {"block": "block", "strip": "strip", "rewrite": "rewrite", "forward": "log"}

# The `prev` of the first record of a fresh chain.
GENESIS = "0" * 64
# Rotated files kept: `<path>.1` (the newest) to `<path>.5`.
KEEP = 5
_TAIL_BLOCK = 64 * 1024


def tenant_of(credential: str | None) -> str | None:
    """A short, stable fingerprint of a client credential; never the credential itself."""
    if not credential:
        return None
    return "t_" + hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def line_hash(line: bytes) -> str:
    """The link of the chain: the sha256 hex of a record's line, without its newline."""
    return hashlib.sha256(line).hexdigest()


@dataclass(frozen=True)
class AuditedRequest:
    """What the audit record says of the request a verdict was made on."""

    request_id: str
    transport: str
    path: str
    body: Any
    raw: bytes
    tenant: str | None
    upstream: str | None = None  # the name of the upstream its route sends it to
    # An MCP request's server (its name under `mcp.servers`) and session (`Mcp-Session-Id`).
    server: str | None = None
    session: str | None = None


def record(request: AuditedRequest, verdict: Verdict, *, include_arguments: bool) -> dict[str, Any]:
    """The audit record of DESIGN.md for a request that had findings (the writer adds `prev`):
    the findings the verdict lists (`Verdict.listed`), and `findings_omitted` when it left
    some out."""
    body = request.body if isinstance(request.body, dict) else {}
    model = body.get("model")
    previous = body.get("previous_response_id")
    listed, omitted = verdict.listed()
    entry: dict[str, Any] = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": "replay_rejected",
        "request_id": request.request_id,
        "action": _OUTCOME_ACTION[verdict.outcome],
        "transport": request.transport,
        "upstream": request.upstream,
        "path": request.path,
        "model": model if isinstance(model, str) else None,
        "previous_response_id": previous if isinstance(previous, str) else None,
        "tenant": request.tenant,
        "body_sha256": hashlib.sha256(request.raw).hexdigest(),
        "findings": [f.as_dict(include_arguments=include_arguments) for f in listed],
    }
    if omitted:
        entry["findings_omitted"] = omitted
    if request.server is not None:
        entry["server"], entry["session"] = request.server, request.session
    return entry


@value
class Relayed:
    """What an emitted-call record says of the request whose answer held the calls; `raw` is
    its body as received (None on a WebSocket, whose records name the connection)."""

    request_id: str
    transport: str
    path: str
    tenant: str | None
    raw: bytes | None = None
    upstream: str | None = None  # the name of the upstream that answered
    dialect: str = "-"  # the API it spoke: the metrics' `dialect` label


def emitted_record(
    relayed: Relayed,
    response: Mapping[str, Any],
    findings: Sequence[Finding],
    *,
    include_arguments: bool,
    max_findings: int = MAX_FINDINGS,
) -> dict[str, Any]:
    """The record of a response whose function_calls failed their schema (door 2): the
    fields of a rejected replay's, `model` and `previous_response_id` the response's, its
    `response_id`, and each finding's `output_index` (its `index` too). The answer was relayed
    as it came: the action is `log`. At most `max_findings` findings are listed, as
    `Verdict.listed` chooses them, with `findings_omitted` when some are left out."""
    model = response.get("model")
    previous = response.get("previous_response_id")
    response_id = response.get("id")
    raw = relayed.raw
    shown, omitted = listed(findings, max_findings)
    entry: dict[str, Any] = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": "emitted_call_rejected",
        "request_id": relayed.request_id,
        "action": "log",
        "transport": relayed.transport,
        "path": relayed.path,
        "model": model if isinstance(model, str) else None,
        "previous_response_id": previous if isinstance(previous, str) else None,
        "tenant": relayed.tenant,
        "upstream": relayed.upstream,
        "body_sha256": hashlib.sha256(raw).hexdigest() if raw is not None else None,
        "response_id": response_id if isinstance(response_id, str) else None,
        "findings": [
            {**f.as_dict(include_arguments=include_arguments), "output_index": f.index}
            for f in shown
        ],
    }
    if omitted:
        entry["findings_omitted"] = omitted
    return entry


class AuditLog:
    """Appends one hash-chained JSON line per record and flushes it before the caller answers.

    A record's `prev` is the hash of the line before it, read from the file under an exclusive
    flock, so that processes sharing the file extend one chain and a restart continues it. With
    `max_bytes`, a file that the next record would take past it becomes `<path>.1` (older ones
    shift up to `<path>.<keep>`) and a new file continues the chain. `-` is stdout, with a chain
    per process: named by `chain` in every record when several processes share stdout, each
    record written whole under an flock on `lock_path` (a pipe interleaves writes over 4 KiB).
    """

    def __init__(
        self,
        path: str,
        *,
        include_arguments: bool = False,
        max_bytes: int | None = None,
        keep: int = KEEP,
        chain: str | None = None,
        lock_path: str | None = None,
    ) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes: {max_bytes} is not positive")
        if keep < 1:
            raise ValueError(f"keep: {keep} is less than 1")
        self.path = path
        self.include_arguments = include_arguments
        self.max_bytes = max_bytes
        self.keep = keep
        self.chain = chain
        self._last = GENESIS
        # The file as this process left it (device, inode, size) and whether its last line is
        # whole: while the file is unchanged, its tail need not be read again.
        self._known: tuple[int, int, int] | None = None
        self._whole = True
        # On stdout only; a file is one chain under its own flock, whoever writes it.
        self._lock: int | None = None
        if path == "-":
            self._fd = sys.stdout.fileno()
            # Opened by each process itself: flock excludes only other open files.
            self._lock = None if lock_path is None else _open(lock_path)
            return
        self._fd = _open(path)
        with self._locked() as st:
            self._read_tail(st)

    def write(self, request: AuditedRequest, verdict: Verdict) -> dict[str, Any]:
        return self.append(record(request, verdict, include_arguments=self.include_arguments))

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Chain one record (its `prev`) to the log and write it."""
        if self.path == "-":
            if self.chain is not None:
                entry["chain"] = self.chain
            entry["prev"] = self._last
            line = _encode(entry)
            sys.stdout.flush()
            if self._lock is None:
                _write_all(self._fd, line + b"\n")
            else:
                fcntl.flock(self._lock, fcntl.LOCK_EX)
                try:
                    _write_all(self._fd, line + b"\n")
                finally:
                    fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._last = line_hash(line)
            return entry
        with self._locked() as st:
            self._read_tail(st)
            entry["prev"] = self._last
            line = _encode(entry)
            # A line cut short (a crash mid-write) keeps its own line, and the chain goes on
            # from it: `audit verify` still points at it.
            data = line + b"\n" if self._whole else b"\n" + line + b"\n"
            if (
                self.max_bytes is not None
                and st.st_size
                and st.st_size + len(data) > self.max_bytes
            ):
                self._rotate(line + b"\n")
            else:
                _write_all(self._fd, data)
                self._known = (st.st_dev, st.st_ino, st.st_size + len(data))
            self._last, self._whole = line_hash(line), True
        return entry

    def close(self) -> None:
        if self.path != "-":
            os.close(self._fd)
        elif self._lock is not None:
            os.close(self._lock)

    @contextmanager
    def _locked(self) -> Iterator[os.stat_result]:
        """Hold an exclusive flock on the file now at `path`, reopening it after a rotation."""
        while True:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                mine = os.fstat(self._fd)
                with suppress(FileNotFoundError):
                    now = os.stat(self.path)
                    if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                        break
            except BaseException:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
            # Another process rotated the file (or it was removed) while this one waited.
            os.close(self._fd)
            self._fd = _open(self.path)
        try:
            yield mine
        finally:
            # After a rotation this is the new file, which was never locked: closing the old
            # one released its lock.
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read_tail(self, st: os.stat_result) -> None:
        if self._known != (st.st_dev, st.st_ino, st.st_size):
            self._last, self._whole = _last_line(self._fd, st.st_size)
            self._known = (st.st_dev, st.st_ino, st.st_size)

    def _rotate(self, data: bytes) -> None:
        """Make `data` the first line of a new file at `path`; the full one becomes `.1`."""
        first = f"{self.path}.1"
        staged = f"{self.path}.next"
        new = _open(staged, truncate=True)
        try:
            _write_all(new, data)
            # A rotation interrupted between link and replace already moved this file to `.1`.
            if not _same_file(self.path, first):
                for n in range(self.keep - 1, 0, -1):
                    with suppress(FileNotFoundError):
                        os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
                with suppress(FileNotFoundError):
                    os.unlink(first)  # with keep=1 it was not shifted away
                # A link and a replace, not two renames: `path` never goes missing, so no
                # process can create an empty file there and start a chain of its own.
                os.link(self.path, first)
            os.replace(staged, self.path)
        except BaseException:
            os.close(new)
            raise
        os.close(self._fd)  # releases the lock the other processes wait on; they reopen `path`
        self._fd = new
        st = os.fstat(new)
        self._known = (st.st_dev, st.st_ino, len(data))


def _open(path: str, *, truncate: bool = False) -> int:
    # Read for the tail, O_APPEND so that every write lands at the end.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    return os.open(path, flags, 0o640)


def _encode(entry: dict[str, Any]) -> bytes:
    # stdlib json with ASCII escapes: any value the gate saw can be written, big integers too.
    return json.dumps(entry, separators=(",", ":")).encode("ascii")


def _write_all(fd: int, data: bytes) -> None:
    # One write() per record: O_APPEND never interleaves it with another process's line.
    written = os.write(fd, data)
    while written < len(data):
        written += os.write(fd, data[written:])


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


def _last_line(fd: int, size: int) -> tuple[str, bool]:
    """The hash of the file's last line and whether a newline ends it, read back from the end."""
    if size == 0:
        return GENESIS, True
    whole = os.pread(fd, 1, size - 1) == b"\n"
    start = size - 1 if whole else size
    parts: list[bytes] = []
    while start > 0:
        n = min(_TAIL_BLOCK, start)
        start -= n
        block = os.pread(fd, n, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            parts.append(block[cut + 1 :])
            break
        parts.append(block)
    return line_hash(b"".join(reversed(parts))), whole


@dataclass(frozen=True)
class Break:
    """Where a file leaves the chain: the line number and what is wrong there."""

    line: int
    reason: str


@dataclass(frozen=True)
class Verification:
    """One file's chains: the records that hold, the hash a next record must carry, any break.

    `last` is the unnamed chain's (records without `chain`, one process or a shared file);
    `chains` the named chains' (several processes on stdout), by name."""

    records: int
    last: str
    broken: Break | None = None
    chains: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Link:
    """Where one chain stands: the hash its next record must carry, and the lines of its last
    two records (0: the chain's start)."""

    expected: str
    start_name: str
    last_line: int = 0
    before: str | None = None  # the hash of the record before the last, once there is one
    before_line: int = 0


FRESH = "a fresh chain's start (64 zeros)"


def verify(
    lines: Iterable[bytes],
    start: str = GENESIS,
    *,
    start_name: str = FRESH,
    chains: Mapping[str, tuple[str, str]] | None = None,
) -> Verification:
    """Walk the chains over a file's lines (each with its newline; the last may lack one).

    Records without `chain` make one chain, which continues from `start` (`start_name` says
    where it came from); each `chain` name is a chain of its own, interleaved with the others,
    which continues from its entry in `chains` (hash, where it came from) or starts fresh.
    Stops at the first break. An edit of a chain's last record leaves no trace in it: compare
    the last hashes with ones kept elsewhere.
    """
    remaining = iter(lines)
    links = {"": _Link(start, start_name)}
    links.update((name, _Link(*at)) for name, at in (chains or {}).items())
    records = 0

    def result(broken: Break | None = None) -> Verification:
        named = {name: link.expected for name, link in links.items() if name}
        return Verification(records, links[""].expected, broken, named)

    for number, raw in enumerate(remaining, 1):
        line = raw.removesuffix(b"\n")
        cut = "" if raw.endswith(b"\n") else " (no newline at the end: the record was cut short)"
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            return result(Break(number, "not JSON" + cut))
        if not isinstance(entry, dict):
            return result(Break(number, "not a JSON object" + cut))
        name = entry.get("chain", "")
        if not isinstance(name, str) or (not name and "chain" in entry):
            return result(Break(number, "chain is not a name (a non-empty string)"))
        prev = entry.get("prev")
        if not isinstance(prev, str):
            return result(Break(number, "no prev: not a chained record"))
        link = links.setdefault(name, _Link(GENESIS, FRESH))
        if prev != link.expected:
            after = _next_of(remaining, name, number)
            broken = _diagnose(number, prev, link, after)
            return result(
                Break(broken.line, f"chain {name}: {broken.reason}" if name else broken.reason)
            )
        if cut:
            return result(Break(number, "truncated" + cut))
        records += 1
        link.before, link.before_line = link.expected, link.last_line
        link.expected, link.last_line = line_hash(line), number
    return result()


def _diagnose(number: int, prev: str, link: _Link, after: tuple[int, object] | None) -> Break:
    """Line `number`'s prev is not what its chain expects: which record of that chain was
    inserted, edited or deleted."""

    def name(n: int) -> str:
        return f"line {n}" if n else link.start_name

    if link.before is not None and prev == link.before:
        return Break(
            link.last_line, f"inserted: line {number} continues from {name(link.before_line)}"
        )
    if after is not None and after[1] == link.expected:
        return Break(number, f"inserted: line {after[0]} continues from {name(link.last_line)}")
    if not link.last_line:
        return Break(
            number,
            f"prev is not {link.start_name}: records before it were deleted or edited, "
            "or the file continues another one",
        )
    return Break(
        number,
        f"prev is not the hash of line {link.last_line}: line {link.last_line} was edited, "
        "or records after it were deleted",
    )


def _next_of(remaining: Iterator[bytes], chain: str, number: int) -> tuple[int, object] | None:
    """The next record of `chain` after line `number`: its line and its prev."""
    for after, raw in enumerate(remaining, number + 1):
        try:
            entry = json.loads(raw.removesuffix(b"\n"))
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict) and entry.get("chain", "") == chain:
            return after, entry.get("prev")
    return None
