"""The tap: watches upstream answers go by and records the responses they complete."""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from proxy.admission import body
from proxy.admission.completions import Completion, StreamedCompletion, completion_of
from proxy.gate.values import value
from proxy.state.ledger import Ledger
from proxy.state.recording import NO_CONTEXT, Context

if TYPE_CHECKING:
    # Only handed over: the hop that relays through the tap loads no schema machinery.
    from proxy.admission.emitted import EmittedCalls
    from proxy.gate.policy import Policy
    from proxy.gate.verdict import Bounds
    from proxy.state.audit import Relayed

    # A turn's context, its route's policy, its config's bounds (None: the defaults) and the
    # request (a WebSocket's frame) that asked for it (None: the tap's own).
    _Turn = tuple[Context | None, Policy | None, Bounds | None, Relayed | None]

log = logging.getLogger("replay_proxy")

_TERMINAL = ("response.completed", "response.incomplete")
# The types of the only SSE events the tap decodes (completed, incomplete, an item done), found
# by one search: on a delta's chunk 0.24 µs, where a `find` per marker takes 0.58 µs (each
# parses its arguments the slow way); on a whole 3.4 kB stream, 1.6 µs against 1.2.
_MARKER = re.compile(rb"response\.(?:completed|incomplete|output_item\.done)")
_LF = ord("\n")


@value
class Recording:
    """Where the answer to a request is recorded: the ledger, the tenant it is recorded for,
    the most bytes read of it, and the request's id for the log."""

    ledger: Ledger
    tenant: str
    limit: int
    request_id: str
    # The context of the request that creates the response; None for an answer that reads a
    # response again (`GET /v1/responses/{id}`), which keeps the context recorded at its creation.
    context: Context | None = NO_CONTEXT
    upstream: str | None = None  # the upstream answering: the ledger records that it made it
    # Where the function_calls of the responses recorded wait for door 2's check; None: unchecked.
    emitted: EmittedCalls | None = None
    # The policy of the route the request took: door 2 checks the answer's calls under it
    # (None: the config's gate), and lists in its record what the config's bounds allow.
    policy: Policy | None = None
    bounds: Bounds | None = None

    # The answer is a Chat completion (`ChatTap`), not an Open Responses response.
    chat: bool = False

    def tap(
        self, status: int, content_type: str, content_encoding: str, content_length: int | None
    ) -> ResponseTap | None:
        """The tap for an answer with this head; only a 200 completes a response."""
        if status != 200:
            return None
        return (ChatTap if self.chat else ResponseTap)(
            self.ledger,
            self.tenant,
            content_type,
            content_length,
            self.limit,
            content_encoding,
            self.request_id,
            self.context,
            self.upstream,
            self.emitted,
            self.policy,
            self.bounds,
        )


class ResponseTap:
    """Watches an upstream answer go by (JSON or SSE) and records the response it completes.

    `feed` sees each chunk before it is forwarded, so a follow-up turn sent the moment the
    client has the whole answer finds the record, on any proxy process sharing the store.

    On a WebSocket one tap sees every turn: `expect` queues each forwarded turn's context and
    policy, and each turn's end (completed, incomplete, failed, or an error event) takes the
    next one: a turn's calls go to door 2 with the policy of the route its own frame took, and
    door 2's record of them names that frame.
    """

    def __init__(
        self,
        ledger: Ledger,
        tenant: str,
        content_type: str,
        content_length: int | None,
        limit: int,
        content_encoding: str = "",
        request_id: str = "-",
        context: Context | None = NO_CONTEXT,
        upstream: str | None = None,
        emitted: EmittedCalls | None = None,
        policy: Policy | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        self.ledger = ledger
        self.upstream = upstream
        self.context = context
        self.emitted = emitted
        self.policy = policy
        self.bounds = bounds
        self.turns: deque[_Turn] | None = None
        self.request_id = request_id
        self.tenant = tenant
        self.sse = content_type.split(";")[0].strip().lower() == "text/event-stream"
        self.expected = content_length
        self.limit = limit
        # The answer is relayed as it came; the tap reads it decoded (a JSON body whole, at
        # its end; a stream chunk by chunk), never past `limit` bytes.
        self.codings = body.codings(content_encoding)
        self.received = 0
        self.pending = bytearray()
        # The events that may be a finished output item, as they came: read only when the
        # response that ends the turn does not list its output itself (most servers' do).
        self.done_items: list[bytes | str] = []
        self.recorded = False
        # A stream is decoded as it goes by, undoing its codings last applied first.
        self.inflaters: list[body.Inflater] = []
        if self.sse:
            try:
                self.inflaters = [body.Inflater(c, limit) for c in reversed(self.codings)]
            except body.BodyError as exc:
                self._unrecorded(exc)
        # A stream read as it comes (not decoded first): `feed` passes over its chunks of whole
        # events that hold no marker without a copy.
        self.passes_over = self.sse and not self.inflaters

    def feed(self, chunk: bytes) -> Awaitable[None] | None:
        """A chunk of the answer: what to await before it goes on, or None when it needs no
        wait. A stream's chunk of whole events none of which the tap decodes (most of them:
        the deltas) is passed over with one search, no copy kept and no coroutine made."""
        if self.recorded:
            return None
        if self.passes_over and not self.pending and chunk.endswith(b"\n\n"):
            first = self._decoded_from(chunk)
            if first < 0:
                return None
            # The events before `first` are not searched again.
            return self._feed(chunk, first)
        return self._feed(chunk)

    def _decoded_from(self, events: bytes) -> int:
        """Where in whole events the first one the tap decodes may be (a marker of a type
        `event` reads), -1 when none is (this runs for every chunk of a stream: one search,
        `_MARKER`)."""
        found = _MARKER.search(events)
        return -1 if found is None else found.start()

    async def _feed(self, chunk: bytes, first: int = 0) -> None:
        """`chunk`, the first that may matter at `first` (when nothing was pending)."""
        self.received += len(chunk)
        if not self.sse and not self.pending and len(chunk) == self.expected:
            self.recorded = True  # the whole body in one chunk, as small answers come
            await self._record_json(chunk)
            return
        try:
            for inflater in self.inflaters:
                chunk = inflater.feed(chunk)
        except body.BodyError as exc:
            self._unrecorded(exc)
            return
        self.pending += chunk
        if self.sse:
            await self._events(first)
        elif len(self.pending) > self.limit:
            self.recorded = True  # too large to keep a copy of; it goes by unrecorded
            self.pending.clear()
        elif self.expected is not None and self.received >= self.expected:
            await self.finish()

    async def finish(self) -> None:
        """The answer has ended: record a JSON response body now."""
        if self.recorded or self.sse:
            return
        self.recorded = True
        try:
            await self._record_json(self.pending)
        finally:
            self.pending.clear()

    async def _record_json(self, data: bytes | bytearray) -> None:
        if self.codings:
            try:
                data = body.decode(bytes(data), self.codings, self.limit)
            except body.BodyError as exc:
                self._unrecorded(exc)
                return
        try:
            response = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(response, dict):
            await self._record(response)

    async def _record(self, response: dict[str, Any]) -> None:
        """A JSON answer, parsed: recorded when it is a response."""
        kind = response.get("object")
        compacts = self.context is not None and self.context.compacts
        if kind == "response" or (kind == "response.compaction" and compacts):
            await self.ledger.record(self.tenant, response, self.context, self.upstream)
            if self.emitted is not None:
                self.emitted.add(response, self.context, self.policy, self.bounds)

    def expect(
        self,
        context: Context,
        policy: Policy | None = None,
        bounds: Bounds | None = None,
        relayed: Relayed | None = None,
    ) -> None:
        """A WebSocket turn was forwarded with this context, on a route with this policy, under
        a config with these bounds, by this frame (`relayed`): its response is recorded with
        the context, its calls checked under the policy, listed within the bounds, and door 2's
        record names the frame."""
        if self.turns is None:
            self.turns = deque()
        self.turns.append((context, policy, bounds, relayed))

    def _turn(self) -> _Turn:
        """The context, policy, bounds and request of the turn whose response ends now."""
        if self.turns is None:
            return self.context, self.policy, self.bounds, None
        return self.turns.popleft() if self.turns else (NO_CONTEXT, None, None, None)

    def _unrecorded(self, fault: body.BodyError) -> None:
        """The tap cannot read this answer in its coding: it goes by, relayed, unrecorded."""
        log.warning("%s an encoded answer goes by unrecorded: %s", self.request_id, fault)
        self.recorded = True
        self.pending.clear()

    async def _events(self, first: int = 0) -> None:
        """The whole events pending, those that may matter from `first` on (a search of
        `feed`'s found no marker before it), read; the last one, not whole yet, kept."""
        pending = self.pending
        start = 0
        if pending.find(b"\r") >= 0:
            # Lines that may end with CRLF: the events one by one, only three kinds decoded.
            for block in take_events(pending):
                if _MARKER.search(block) is not None:
                    await self._event(event_data(block))
        else:
            # Most servers end lines with LF alone: then the events that matter are found by
            # their markers, and the rest (the deltas) are never looked at one by one; the
            # buffer is read once, whatever the number of events it holds.
            search = _MARKER.search
            found = search(pending, first)
            while found is not None:
                at = found.start()
                begin = pending.rfind(b"\n\n", start, at)
                begin = start if begin < 0 else begin + 2
                end = pending.find(b"\n\n", at)
                if end < 0:
                    start = begin  # that event is not whole yet
                    break
                await self._event(event_data(pending[begin:end]))
                start = end + 2
                found = search(pending, start)
            else:
                # No event that matters is whole: drop every whole one, keep the last, partial
                # one (a marker may yet arrive in it).
                end = pending.rfind(b"\n\n", start)
                start = start if end < 0 else end + 2
        del pending[:start]
        if len(pending) > self.limit:
            self.recorded = True
            pending.clear()

    async def event(self, data: bytes | str) -> None:
        """One event's JSON (an SSE `data:` or a WebSocket frame)."""
        if _MARKERS_OF[type(data)].search(data) is not None:
            await self._event(data)

    async def _event(self, data: bytes | str) -> None:
        """An event whose type may be one the tap reads (its block holds a marker)."""
        if _ENDS_OF[type(data)].search(data) is None:
            # Only an output item can be done here: kept unread for the turn's end.
            self.done_items.append(data)
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.done_items.append(data)
        elif kind in _TERMINAL and isinstance(event.get("response"), dict):
            response = event["response"]
            if not response.get("output") and self.done_items:
                response = {**response, "output": _done_items(self.done_items)}
            self.done_items = []
            context, policy, bounds, relayed = self._turn()
            await self.ledger.record(self.tenant, response, context, self.upstream)
            if self.emitted is not None:
                self.emitted.add(response, context, policy, bounds, relayed)
        elif kind in _FAILED and self.turns:
            self.done_items = []
            self.turns.popleft()  # the turn ended without a response to record


_FAILED = ("response.failed", "error")
# The events that end a turn hold one of these (their type); an event without any is at most
# an output item done. One search for all (a `find` per marker parses its arguments the slow
# way: on an item's done event 0.89 µs, the expression 0.44).
_ENDS_OF: dict[type, re.Pattern[Any]] = {
    bytes: re.compile(rb"response\.(?:completed|incomplete)"),
    str: re.compile(r"response\.(?:completed|incomplete|failed)|error"),
}


def _done_items(events: list[bytes | str]) -> list[Any]:
    """The items of the `response.output_item.done` events among `events`, in order."""
    found = []
    for data in events:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if (
            isinstance(event, dict)
            and event.get("type") == "response.output_item.done"
            and isinstance(event.get("item"), dict)
        ):
            found.append(event["item"])
    return found


# The blank line that ends an SSE event (its lines may end with CRLF).
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_MARKERS_OF: dict[type, re.Pattern[Any]] = {
    bytes: _MARKER,
    # WebSocket frames: a failed turn ends too (its queued context is dropped).
    str: re.compile(r"response\.(?:completed|incomplete|output_item\.done|failed)|error"),
}


def take_events(pending: bytearray) -> list[bytearray]:
    """The whole SSE events at the start of `pending`, taken out of it, each its lines without
    the blank line that ends it; a last event not yet whole stays."""
    blocks = []
    start = 0
    while (match := _EVENT_END.search(pending, start)) is not None:
        blocks.append(pending[start : match.start()])
        start = match.end()
    del pending[:start]
    return blocks


def event_data(block: bytes | bytearray) -> bytes:
    """What an SSE event's `data:` lines carry, joined as the spec joins them."""
    at = block.find(b"data:")
    if at >= 0 and (at == 0 or block[at - 1] == _LF):
        # The usual event: one `data:` line, lines ending with LF; cut out of its block. (A
        # second one starts after the first's end: the data, most of the block, is searched
        # for a line end alone, one byte, the fastest search there is.)
        end = block.find(b"\n", at)
        end = len(block) if end < 0 else end
        if block.find(b"data:", end) < 0 and block.find(b"\r") < 0:
            return bytes(block[at + 5 : end]).removeprefix(b" ")
    lines = [
        line[5:].removeprefix(b" ") for line in block.splitlines() if line.startswith(b"data:")
    ]
    return b"\n".join(lines)


class ChatTap(ResponseTap):
    """Watches a Chat Completions answer go by (JSON or SSE) and records the completion's tool
    calls (`proxy.admission.completions`), under a key of the request's own: the proxy relayed
    them to this tenant, from this upstream, complete or cut.

    A stream's chunks are read only when they carry call fragments or a choice's end; it is
    recorded at `data: [DONE]`, or when it ends without one (a choice that never said how it
    ended is cut). Past `limit` characters of arguments, it goes by unrecorded.
    """

    def _decoded_from(self, events: bytes) -> int:
        """0 when whole events may end the stream or a choice, or carry a call (they are read
        one by one), else -1."""
        may = (
            events.find(b"[DONE]") >= 0
            or events.find(b"tool_calls") >= 0
            or (events.find(b'"finish_reason"') >= 0 and _FINISHED.search(events) is not None)
        )
        return 0 if may else -1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stream = StreamedCompletion()

    async def _record(self, response: dict[str, Any]) -> None:
        completion = completion_of(response)
        if completion is not None:
            await self._record_completion(completion)

    async def _record_completion(self, completion: Completion) -> None:
        recorded = completion.recorded_as(f"chat/{self.request_id}")
        await self.ledger.record(self.tenant, recorded, self.context, self.upstream)
        if self.emitted is not None:
            self.emitted.add(
                completion.response,
                self.context,
                self.policy,
                self.bounds,
                places=completion.places,
            )

    async def finish(self) -> None:
        if self.sse and not self.recorded:
            await self._end_stream()
            return
        await super().finish()

    async def _end_stream(self) -> None:
        self.recorded = True
        self.pending.clear()
        completion = self.stream.completion()
        if completion is not None:
            await self._record_completion(completion)

    async def _events(self, first: int = 0) -> None:
        pending = self.pending
        for block in take_events(pending):
            if block.find(b"[DONE]") >= 0 and event_data(block).strip() == b"[DONE]":
                await self._end_stream()
                return
            if block.find(b"tool_calls") < 0 and not _FINISHED.search(block):
                continue  # a delta of text: nothing to record
            try:
                chunk = orjson.loads(event_data(block))
            except orjson.JSONDecodeError:
                continue
            if isinstance(chunk, dict):
                self.stream.add(chunk)
            if self.stream.size > self.limit:
                self.recorded = True  # too large to keep a copy of; it goes by unrecorded
                pending.clear()
                return
        if len(pending) > self.limit:
            self.recorded = True
            pending.clear()


# A chunk that ends a choice: its `finish_reason` is a string, not null.
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
