"""The replay gate's verdict: may each function_call_output in input be replayed, and why not."""

from __future__ import annotations

import functools
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jsonschema.exceptions import SchemaError

from proxy.gate import items
from proxy.gate.acceptor import Steps
from proxy.gate.arguments import judged_arguments, schemas_key
from proxy.gate.budget import Allowance
from proxy.gate.caches import GateCaches, PassedKey
from proxy.gate.call_limits import CallLimits
from proxy.gate.errors import error_document
from proxy.gate.findings import MESSAGES, Failed, Finding
from proxy.gate.grammar import check_input, custom_formats
from proxy.gate.items import Item
from proxy.gate.pairing import NOTHING_RECORDED, Pairing, Recorded
from proxy.gate.phrases import detail_of
from proxy.gate.policy import Policy
from proxy.gate.portable import QUICK_STEPS
from proxy.gate.reasons import (
    AMBIGUOUS_ITEM,
    ENVELOPE,
    FOREIGN_ITEM,
    ITEM_REASONS,
    UNKNOWN_REFERENCE,
    Action,
    Outcome,
    Reason,
)
from proxy.gate.records import failure_output
from proxy.gate.schemas import (
    MAX_VIOLATIONS,
    Compiled,
)
from proxy.gate.vocabulary import Kind, PayloadCheck, vocabulary_of

# Findings listed per answer or record by default (`limits.max_findings`); the others counted.
MAX_FINDINGS = 100
# The fields the spec defines for a function_call_output: all a rewritten output keeps.
OUTPUT_FIELDS = ("type", "id", "call_id", "output", "status")
# The output kinds a failure record can stand in for: answered by `call_id`, with an `output`
# that may be a string (the record).
_REWRITABLE = frozenset({"function_call_output", "custom_tool_call_output"})


@dataclass(frozen=True, slots=True)
class _TooLarge:
    """A body the gate would change past `limit` (`Bounds.max_body_bytes`): more than `size`
    bytes."""

    size: int
    limit: int


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much one request's verdict may say, whatever the request: at most `max_findings`
    findings listed (the blocking ones first) and `max_violations` violations per finding; what
    is left out is counted. With `max_body_bytes`, a rewrite whose failure records alone would
    take the body past it is blocked before the body is built (the front checks the body it
    builds against the same limit). Raises ValueError naming a bound that is not a positive
    integer."""

    max_findings: int = MAX_FINDINGS
    max_violations: int = MAX_VIOLATIONS
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_findings", "max_violations", "max_body_bytes"):
            value = getattr(self, name)
            if value is None and name == "max_body_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} is not a positive integer")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's decision for one request; `input` is what to forward when the outcome is strip
    or rewrite: stripped pairs gone, rewritten outputs carrying their failure record."""

    outcome: Outcome
    findings: tuple[Finding, ...] = ()
    input: list[Any] | None = None
    bounds: Bounds = Bounds()
    # Members of the body that do not go upstream (a stripped `messages` envelope).
    without: frozenset[str] = frozenset()
    # Why a request whose findings would have let it through was blocked (its forwarded body
    # over `limits.max_body_bytes`), said before its first finding.
    note: str | None = None

    def count(self, action: Action) -> int:
        return sum(1 for f in self.findings if f.action == action)

    def header(self) -> str | None:
        """The `x-replay-gate` value for a forwarded request that had findings."""
        if not self.findings:
            return None
        parts = [
            f"{a}={n}"
            for a, n in (
                ("stripped", self.count("strip")),
                ("rewritten", self.count("rewrite")),
                ("logged", self.count("log")),
            )
            if n
        ]
        return ", ".join(parts) or None

    def listed(self) -> tuple[tuple[Finding, ...], int]:
        """The findings an answer or a record lists, and how many it leaves out."""
        return listed(self.findings, self.bounds.max_findings)

    def blocked(self, note: str) -> Verdict:
        """This verdict blocked after all, `note` saying why: what it would strip or rewrite
        is blocked instead."""
        findings = tuple(
            f if f.action in ("block", "log") else replace(f, action="block") for f in self.findings
        )
        return Verdict(Outcome.BLOCK, findings, bounds=self.bounds, note=note)


def inspect(
    body: Any,
    policy: Policy,
    recorded: Recorded = NOTHING_RECORDED,
    caches: GateCaches | None = None,
    bounds: Bounds = Bounds(),
    limits: CallLimits | None = None,
    declared: list[tuple[str, Any]] | None = None,
) -> Verdict:
    """Gate every `function_call_output` in the body's `input`, and a Chat Completions body's
    `messages`; never raises on any JSON value. (`declared`: the body's
    `items.declared_tools`, when the caller has them already.)

    `caches` carries compiled schemas and verdicts from one request to the next (the fronts
    pass theirs); without it this request's are forgotten when it is done. `bounds` caps what
    the verdict lists (its cost too: violations past the cap are counted, never rendered).
    `limits` are those the target's API puts on a paired call beyond the spec's item schema
    (`not_portable` too)."""
    if not isinstance(body, dict):
        return Verdict(Outcome.FORWARD)
    input_items = body.get("input")
    chat = isinstance(body.get(MESSAGES), list)
    if not isinstance(input_items, list):
        if not chat:
            return Verdict(Outcome.FORWARD)
        input_items = []
    if caches is None:
        caches = GateCaches.for_policy(policy)
    return _Inspection(body, input_items, policy, recorded, caches, bounds, limits, declared).run()


def judges_nothing(body: Mapping[str, Any]) -> bool:
    """Whether `inspect` has nothing to judge in `body`: an `input` of messages alone, none of
    them a Chat Completions envelope, and no `messages` member. A message pairs with no output
    and is native to every vocabulary, so such a body is clean whatever its tools, its policy
    and its history, with no schema to compile (a conversation's first turn, most often)."""
    listed = body.get("input")
    if not isinstance(listed, list) or MESSAGES in body:
        return False
    kind, is_envelope, message = items.kind, items.is_envelope, items.MESSAGE
    # A loop, not `all(...)`: a generator's frame resumed per item costs a tenth of the saving.
    for item in listed:
        if kind(item) != message or is_envelope(item):
            break
    else:
        return True
    return False


class _Inspection:
    """One request's pass over its `input`."""

    def __init__(
        self,
        body: Mapping[str, Any],
        input_items: list[Any],
        policy: Policy,
        recorded: Recorded,
        caches: GateCaches,
        bounds: Bounds,
        limits: CallLimits | None = None,
        declared: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.body = body
        self.bounds = bounds
        self.limits = limits
        self.input = input_items
        self.policy = policy
        self.caches = caches
        self.recorded = recorded
        self.request_schemas: dict[str, list[Any]] | None = None
        self.declared = declared  # the body's tools, if the caller found them already
        self.compiled: dict[str, tuple[list[Compiled | SchemaError], tuple[int, ...]]] = {}
        # The custom tools' formats, the MCP tools listed in the context, and the latter's
        # schemas compiled: each found once per request, when a call needs them.
        self.formats: dict[str, list[Any]] | None = None
        self.listed: dict[str, list[Any]] | None = None
        self.compiled_mcp: dict[str, tuple[list[Compiled | SchemaError], tuple[int, ...]]] = {}
        self.allowance = Allowance(policy.validation_timeout_s)
        self.steps = Steps(QUICK_STEPS)
        self.vocabulary = vocabulary_of(policy.vendor)
        self.pairing = Pairing(input_items, recorded, self.vocabulary)

    def run(self) -> Verdict:
        findings = list(self.iter_findings())
        bounds = self.bounds
        if not findings:
            return clean(bounds)
        # Stripping an output whose call lives only upstream would leave a dangling call; an
        # output whose kind has no string `output` for the failure record cannot be rewritten.
        escalated = {f.index for f in findings if self.dangles(f) or self.unrewritable(f)}
        if escalated:
            findings = [replace(f, action="block") if f.index in escalated else f for f in findings]
        if any(f.action == "block" for f in findings):
            return Verdict(Outcome.BLOCK, tuple(findings), bounds=bounds)
        without = frozenset(
            f.param for f in findings if f.action == "strip" and f.param is not None
        )
        # A body without an `input` list (a Chat Completions one) is given none.
        changed = self.changed(findings) if isinstance(self.body.get("input"), list) else None
        if isinstance(changed, _TooLarge):
            verdict = Verdict(Outcome.REWRITE, tuple(findings), bounds=bounds)
            said = over_limit(verdict, f"more than {changed.size}", changed.limit)
            return verdict.blocked(said)
        if any(f.action == "strip" for f in findings):
            return Verdict(Outcome.STRIP, tuple(findings), changed, bounds, without)
        if any(f.action == "rewrite" for f in findings):
            return Verdict(Outcome.REWRITE, tuple(findings), changed, bounds)
        return Verdict(Outcome.FORWARD, tuple(findings), bounds=bounds)

    def iter_findings(self) -> Iterator[Finding]:
        """Every finding of the body, in its order: the body's own, then each item's."""
        if isinstance(self.body.get(MESSAGES), list):
            # A Chat Completions request sent to a Responses path: `check` reports it so too.
            yield Finding(None, ENVELOPE, self.policy.action_for(ENVELOPE), param=MESSAGES)
        # Looked up once, not per item: most upstreams have no vendor (no item is foreign)
        # and a vocabulary with no kind that carries its own result.
        pairing = self.pairing
        kinds, ambiguous, unknown = pairing.kinds, pairing.ambiguous, pairing.unknown
        outputs, ran = self.vocabulary.outputs, self.vocabulary.ran
        vendor = self.policy.vendor
        is_envelope = items.is_envelope
        for index, item in enumerate(self.input):
            if is_envelope(item):
                yield self.finding(index, _string(item.get("tool_call_id")), ENVELOPE)
            if index in ambiguous:
                yield self.finding(index, _string(item.get("call_id")), AMBIGUOUS_ITEM)
            elif index in unknown:
                found = self.finding(index, None, UNKNOWN_REFERENCE)
                yield replace(found, reference=items.reference_id(item))
            if vendor is not None:
                foreign = self.foreign(index, item)
                if foreign is not None:
                    yield foreign
            item_kind = kinds[index]
            if item_kind is None:
                continue
            # An output that also carries an envelope key is still gated: the envelope's action
            # (say `log`) must not let its call past a stricter reason's action.
            family = outputs.get(item_kind)
            if family is not None:
                finding = self.check_output(index, item, family)
                if finding is not None:
                    yield finding
            elif ran and (own := ran.get(item_kind)) is not None:
                # A call the server ran, its output inside it (an `mcp_call`): judged itself.
                finding = self.check_ran(index, item, own)
                if finding is not None:
                    yield finding

    def dangles(self, finding: Finding) -> bool:
        """Whether stripping what `finding` strips would leave a call that lives upstream
        without its output: a foreign item answered upstream, or an output of such a call."""
        if finding.action != "strip" or finding.index is None:
            return False
        if finding.reason == FOREIGN_ITEM:
            return self.answered_upstream(finding.index)
        if finding.reason in ITEM_REASONS:
            return False
        return self.pairing.pairs_upstream(finding.call_id)

    def unrewritable(self, finding: Finding) -> bool:
        """Whether `finding` would rewrite an output whose kind the failure record does not
        fit: only a function_call_output (or a typeless one) and a custom_tool_call_output
        answer by `call_id` with an `output` that may be a string; a computer, shell or patch
        output, or an MCP approval, would be left without its own fields or its pair."""
        if finding.action != "rewrite" or finding.index is None:
            return False
        if finding.reason in ITEM_REASONS:
            return False
        item = self.input[finding.index]
        kind = item.get("type") if isinstance(item, dict) else None
        return kind not in _REWRITABLE and kind not in (None, "", False)

    def finding(self, index: int, call_id: str | None, reason: Reason) -> Finding:
        return Finding(index, reason, self.policy.action_for(reason), call_id)

    def failed(
        self,
        index: int,
        call_id: str | None,
        failed: Failed,
        paired_index: int | None,
        call: Item,
        detail: str | None = None,
    ) -> Finding:
        """The finding of the output at `index`, whose paired `call` failed."""
        name = call.get("name")
        return Finding(
            index,
            failed.reason,
            self.policy.action_for(failed.reason),
            call_id,
            paired_index,
            name if isinstance(name, str) else None,
            failed.fail,
            call.get("arguments"),
            passed=failed.passed,
            item_type=failed.item_type,
            detail=detail,
            fail_omitted=failed.fail_omitted,
        )

    def foreign(self, index: int, item: Any) -> Finding | None:
        """An item typed with another vendor's slug than the target's, or of a kind outside the
        target's vocabulary; None when the target's vendor is not known, or the item is native,
        or is not typed with a string."""
        vendor = self.policy.vendor
        if vendor is None or not isinstance(item, dict):
            return None
        item_type = item.get("type")
        slug = items.vendor_of(item_type)
        if slug is None:
            if not item_type or not isinstance(item_type, str):
                return None
            if self.vocabulary.native(item_type):
                return None
        elif slug == vendor:
            return None
        found = self.finding(index, _string(item.get("call_id")), FOREIGN_ITEM)
        return replace(found, item_type=item_type)

    def answers(self, index: int) -> list[int]:
        """The outputs after the item at `index` that answer it (by its pairing key)."""
        key = items.pairing_key(self.input[index])
        found = self.pairing.outputs.get(key, []) if key is not None else []
        return found[bisect_right(found, index) :]

    def answered_upstream(self, index: int) -> bool:
        """Whether stripping the item at `index` with the outputs that answer it would leave a
        call that lives upstream with its output gone."""
        return bool(self.answers(index)) and self.pairing.pairs_upstream(
            items.pairing_key(self.input[index])
        )

    def check_output(self, index: int, output: Item, family: Kind) -> Finding | None:
        """The finding of the output at `index`, of the kind `family`, or None when its call
        may be replayed: `judge_output`, unless the output `passes_as_before`."""
        field = family.pairs_by
        found = output.get(field) if field is not None else None
        if isinstance(found, str) and self.passes_as_before(index, output, found, family):
            return None
        return self.judge_output(index, output, family)

    def judge_output(self, index: int, output: Item, family: Kind) -> Finding | None:
        """The finding of the output at `index`, of the kind `family`, or None when its call
        may be replayed. A family other than function calls names its call's kind in the
        finding's `item_type`, for its sentences."""
        said = None if family.partner == items.FUNCTION_CALL else family.partner
        field = family.pairs_by
        found = output.get(field) if field is not None else None
        call_id = found if isinstance(found, str) else None
        if call_id is None:
            return replace(self.finding(index, call_id, Reason.ORPHAN), item_type=said)
        pairing = self.pairing
        inline, by_reference, upstream = pairing.paired(index, call_id)
        candidates = inline + by_reference + len(upstream)
        if not candidates:
            if self.recorded.trust_unpaired:
                return None
            return replace(self.finding(index, call_id, Reason.ORPHAN), item_type=said)
        paired_index: int | None
        if inline:
            paired_index = pairing.candidates[call_id][0]
            call = self.input[paired_index]
        elif by_reference:
            paired_index = pairing.referenced[call_id][0]
            call = pairing.resolved[paired_index]
        else:
            paired_index, call = None, upstream[0]
        # `distinct` never counts more calls than candidates: one candidate is one call.
        twice = candidates > 1 and pairing.distinct(call_id, inline, by_reference, upstream) > 1
        if twice or len(pairing.outputs.get(call_id, ())) > 1:
            duplicate = Failed(Reason.DUPLICATE_CALL_ID, item_type=said)
            return self.failed(index, call_id, duplicate, paired_index, call)
        failed = self.check_call(call, output, family, recorded=not inline)
        if failed is None:
            return None
        if said is not None:
            failed = replace(failed, item_type=said)
        reason = failed.reason
        emitted = self.recorded.emitted_statuses(call) if reason == Reason.STATUS else ()
        detail = detail_of(reason, call, emitted)
        return self.failed(index, call_id, failed, paired_index, call, detail)

    def passes_as_before(self, index: int, output: Item, call_id: str, family: Kind) -> bool:
        """Whether the output at `index`, answering `call_id`, is the clean case of a history
        re-sent: one inline call before it and no other candidate (no reference, compaction or
        recorded call), no other output of `call_id`, the call remembered as passed, and the
        output passed by the quick acceptor. True only where `judge_output` finds nothing, with
        the same look-ups (`check_call`'s); False says nothing, and the output is judged.

        Most outputs of a conversation are this case: it is decided without the counting and
        the candidates' look-ups `judge_output` makes for every other."""
        pairing = self.pairing
        inline = pairing.candidates.get(call_id)
        if (
            inline is None
            or inline[0] > index
            or (len(inline) > 1 and inline[1] < index)
            or call_id in pairing.referenced
            or call_id in pairing.compacted
            or len(pairing.outputs.get(call_id, ())) > 1
            or self.recorded.calls(call_id)
        ):
            return False
        key = self.passed_key(self.input[inline[0]], family)
        if key is None or not self.caches.passed_calls.get(key):
            return False
        left = self.steps.left
        if self.caches.item_schemas.quick_output_passes(output, self.steps):
            return True
        self.steps.left = left
        return False

    def check_ran(self, index: int, call: Item, kind: Kind) -> Finding | None:
        """The finding of a call at `index` that carries its own result (an `mcp_call`): its
        arguments against its tool's schema; None when they pass."""
        failed = self.check_payload(call, kind.check)
        if failed is None:
            return None
        failed = replace(failed, item_type=kind.type)
        return self.failed(index, None, failed, None, call, detail_of(failed.reason, call, ()))

    def check_payload(self, call: Item, check: PayloadCheck) -> Failed | None:
        """A call's arguments or input, checked as its kind says: an MCP tool's against the
        `input_schema` its list gives, a custom tool's against its `format`."""
        if check == PayloadCheck.GRAMMAR:
            name = items.tool_name(call)
            formats = self.custom_formats().get(name, []) if name is not None else []
            return check_input(call.get("input"), formats, self.allowance)
        if check != PayloadCheck.MCP_SCHEMA:
            return None
        arguments = call.get("arguments")
        if not isinstance(arguments, str):
            return Failed(Reason.ARGUMENTS_TYPE)
        name = items.mcp_tool_name(call)
        schemas, key = self.mcp_schemas_for(name) if name is not None else ([], ())
        return judged_arguments(
            arguments, schemas, key, self.caches, self.allowance, self.bounds.max_violations
        )

    def custom_formats(self) -> dict[str, list[Any]]:
        """The `format` of each custom tool the request declares, by name."""
        if self.formats is None:
            self.formats = {}
            declared = [self.body.get("tools")]
            declared += [
                item.get("tools")
                for item in self.input
                if isinstance(item, dict) and item.get("type") in items.TOOL_ITEMS
            ]
            for tools in declared:
                for name, found in custom_formats(tools):
                    self.formats.setdefault(name, []).append(found)
        return self.formats

    def mcp_schemas_for(self, name: str) -> tuple[list[Compiled | SchemaError], tuple[int, ...]]:
        """The pinned schema (`<server_label>/<name>`, else the bare name), else the
        `input_schema` of every `mcp_list_tools` item of the context that lists the tool:
        inline, behind a reference, or in the recorded chain."""
        found = self.compiled_mcp.get(name)
        if found is None:
            if self.listed is None:
                self.listed = {}
                lists = [
                    *(i for i in self.input if isinstance(i, dict)),
                    *self.pairing.resolved.values(),
                    *self.recorded.mcp_lists(),
                ]
                for listed in lists:
                    for tool, schema in items.mcp_tools(listed):
                        self.listed.setdefault(tool, []).append(schema)
            pinned = self.policy.pin_for(name)
            schemas: list[Compiled | SchemaError] = (
                [pinned]
                if pinned is not None
                else [self.compile(s) for s in self.listed.get(name, ())]
            )
            found = self.compiled_mcp[name] = (schemas, schemas_key(schemas))
        return found

    def check_call(
        self, call: Item, output: Item, family: Kind, *, recorded: bool
    ) -> Failed | None:
        """What the paired item (or, for `not_portable`, its output) fails first, or None when
        it passes: `judge_call`, remembered for an inline call that passed.

        A conversation re-sends its history on every turn; an inline call that passed every
        check of its own (its kind and type, the spec's call schema, its status, its arguments)
        passes them again when it comes back with the same fields and values under the same
        schemas, so only its output is checked again (by the quick acceptor; anything it does
        not pass is judged in full). Only strings and nulls make the key (`1`, `1.0` and `true`
        are equal in Python, not in a schema), and never a call whose verdict reads the ledger
        (provenance required, or a status left out)."""
        key = None if recorded else self.passed_key(call, family)
        if key is not None and self.caches.passed_calls.get(key):
            left = self.steps.left
            if self.caches.item_schemas.quick_output_passes(output, self.steps):
                return None
            self.steps.left = left  # judged in full, as if this look had not been made
        failed = self.judge_call(call, output, family, recorded=recorded)
        if failed is None and key is not None:
            self.caches.passed_calls.put(key, True)
        return failed

    def passed_key(self, call: Item, family: Kind) -> PassedKey | None:
        """The key a passing inline call is remembered under, or None when it is not."""
        if self.policy.require_provenance or call.get("status") is None:
            return None
        values = tuple(call.values())
        for value in values:
            if value is not None and type(value) is not str:
                return None
        # Every value is a string or null here: a call without a namespace is named by `name`.
        name = items.tool_name(call) if items.NAMESPACE in call else call.get("name")
        if name is None:
            return None
        schemas = self.schemas_for(name)[1]
        vendor, cap = self.policy.vendor, self.bounds.max_violations
        # The fields as two flat tuples, names and values in one order: two tuples to hash and
        # compare on every look-up, not one per field.
        return (family.partner, vendor, self.limits, cap, schemas, tuple(call), values)

    def judge_call(
        self, call: Item, output: Item, family: Kind, *, recorded: bool
    ) -> Failed | None:
        """What the paired item (or, for `not_portable`, its output) fails first, or None when
        it passes.

        A `recorded` call (read from the ledger, not sent inline) whose tool neither the config
        pins nor the request offers is judged by the schema of its own tool, recorded with it.
        """
        status = call.get("status")
        # Asked only when it matters: most replayed calls carry their status.
        emitted: Sequence[Any] = ()
        if self.policy.require_provenance or status is None:
            emitted = self.recorded.emitted_statuses(call)
        if self.policy.require_provenance and not (
            emitted and (status is None or status in emitted)
        ):
            return Failed(Reason.PROVENANCE)
        # The paired item must say it is a function_call: a typeless one pairs, and fails here.
        item_type = call.get("type")
        if items.is_namespaced(item_type):
            return Failed(Reason.NAMESPACED)
        if item_type != family.partner:
            return Failed(Reason.NOT_FUNCTION_CALL)
        if item_type != items.FUNCTION_CALL:
            failed = self.check_status(call, status, emitted)
            kind = self.vocabulary.of(item_type)
            if failed is not None or kind is None:
                return failed
            return self.check_payload(call, kind.check)
        limits = self.limits
        unportable = None
        if limits is None or limits.item_schema:
            unportable = self.caches.item_schemas.check_pair(
                call, output, self.caches.portable, self.allowance, self.steps
            )
        if unportable is None and limits is not None:
            beyond = tuple(limits.iter_violations(call))
            unportable = (items.FUNCTION_CALL, beyond) if beyond else None
        if unportable is not None:
            item_type, fail = unportable
            cap = self.bounds.max_violations
            omitted = max(len(fail) - cap, 0)
            return Failed(Reason.NOT_PORTABLE, fail[:cap], (), omitted, item_type)
        failed = self.check_status(call, status, emitted)
        if failed is not None:
            return failed
        arguments = call.get("arguments")
        if not isinstance(arguments, str):
            return Failed(Reason.ARGUMENTS_TYPE)
        name = items.tool_name(call)
        schemas, key = self.schemas_for(name) if name is not None else ([], ())
        if not schemas and recorded:
            schemas, key = self.recorded_schemas(call.get(items.RECORDED_SCHEMAS))
        return judged_arguments(
            arguments, schemas, key, self.caches, self.allowance, self.bounds.max_violations
        )

    def check_status(self, call: Item, status: Any, emitted: Sequence[Any]) -> Failed | None:
        """`status`, for a call whose kind carries one in the vocabulary (a custom tool's
        call has none)."""
        kind = self.vocabulary.of(call.get("type"))
        if kind is not None and not kind.status:
            return None
        if status is None and emitted:
            # A call replayed without its status is judged by the status the proxy relayed it
            # with; when it was relayed with several, by none of them.
            if any(s != emitted[0] for s in emitted):
                return Failed(Reason.STATUS)
            status = emitted[0]
        if status != "completed" and not (status is None and self.policy.allow_missing_status):
            return Failed(Reason.STATUS)
        return None

    def schemas_for(self, name: str) -> tuple[list[Compiled | SchemaError], tuple[int, ...]]:
        """The pinned schema, else every `parameters` of that name the request declares; and
        the key of the verdicts made against them (looked up once per name and request)."""
        found = self.compiled.get(name)
        if found is None:
            pinned = self.policy.pin_for(name)
            schemas: list[Compiled | SchemaError] = (
                [pinned] if pinned is not None else self.compile_request_schemas(name)
            )
            found = self.compiled[name] = (schemas, schemas_key(schemas))
        return found

    def recorded_schemas(
        self, recorded: Any
    ) -> tuple[list[Compiled | SchemaError], tuple[int, ...]]:
        """The schemas of a call's own tool, as the ledger recorded them with the call."""
        found = [self.compile(p) for p in recorded] if isinstance(recorded, list) else []
        return found, schemas_key(found)

    def compile(self, parameters: Any) -> Compiled | SchemaError:
        # A function tool without parameters constrains nothing but strict JSON.
        schema = {} if parameters is None else parameters
        try:
            return self.caches.schemas.compile(schema, self.policy.schema_limits)
        except SchemaError as exc:
            return exc

    def compile_request_schemas(self, name: str) -> list[Compiled | SchemaError]:
        if self.request_schemas is None:
            self.request_schemas = {}
            declared = self.declared
            for tool_name, parameters in (
                items.declared_tools(self.body) if declared is None else declared
            ):
                self.request_schemas.setdefault(tool_name, []).append(parameters)
        return [self.compile(parameters) for parameters in self.request_schemas.get(name, ())]

    def changed(self, findings: list[Finding]) -> list[Any] | _TooLarge:
        """The input as it goes upstream: stripped pairs gone, rewritten outputs rebuilt around
        the failure record (the call, wherever it is, stays as it was: a rewritten output never
        dangles, so a rewrite never escalates).

        Past `bounds.max_body_bytes` of failure records alone it stops: such a body is never
        forwarded, so it is not built either (thousands of records of 40 KB each)."""
        kept = self.stripped(findings)
        rewritten: dict[int, dict[str, Any]] = {}
        size = 0
        limit = self.bounds.max_body_bytes
        for f in findings:
            if f.action == "rewrite" and f.index is not None:
                record = failure_output(f)
                size += len(record)
                if limit is not None and size > limit:
                    return _TooLarge(size, limit)
                rewritten[f.index] = rewritten_output(self.input[f.index], record)
        if not rewritten:
            return kept
        # Kept items are the input's own objects, in order: a rewritten one is found by identity.
        kept_ids = {id(item) for item in kept}
        return [rewritten.get(i, item) for i, item in enumerate(self.input) if id(item) in kept_ids]

    def stripped(self, findings: list[Finding]) -> list[Any]:
        """The input without stripped outputs and their inline pairs, closed so nothing dangles."""
        removed: set[int] = set()
        # The inline pairs of the outputs of a call_id are prefixes of one list: the latest
        # stripped output's prefix holds all the others.
        latest: dict[str, int] = {}
        for f in findings:
            if f.action == "strip" and f.index is not None:
                removed.add(f.index)
                if f.reason == FOREIGN_ITEM:
                    # Its outputs go with it, wherever their own findings send them.
                    removed.update(self.answers(f.index))
                elif f.reason not in ITEM_REASONS and f.call_id is not None:
                    latest[f.call_id] = max(latest.get(f.call_id, f.index), f.index)
        return self.pairing.without(removed, latest)


@functools.lru_cache(maxsize=16)
def clean(bounds: Bounds) -> Verdict:
    """The verdict of a request without findings under `bounds`: one value shared by every such
    request (a frozen one, built once: most requests are clean)."""
    return Verdict(Outcome.FORWARD, bounds=bounds)


def listed(findings: Sequence[Finding], limit: int) -> tuple[tuple[Finding, ...], int]:
    """At most `limit` of `findings`, the blocking ones first, kept in input order; and how many
    are left out."""
    if len(findings) <= limit:
        return tuple(findings), 0
    chosen = sorted(range(len(findings)), key=lambda i: findings[i].action != "block")
    return tuple(findings[i] for i in sorted(chosen[:limit])), len(findings) - limit


def over_limit(verdict: Verdict, size: str, limit: int) -> str:
    """Why a body the gate changed is blocked instead: it would be `size` bytes, over `limit`."""
    done = (
        "with its outputs rewritten"
        if verdict.outcome is Outcome.REWRITE
        else "as the gate left it"
    )
    return (
        f"the body {done} would be {size} bytes, over limits.max_body_bytes ({limit}): "
        "blocked instead"
    )


def rewritten_output(output: Item, record: str) -> dict[str, Any]:
    """A failing output rebuilt around its failure record: only the fields the spec defines
    for a function_call_output, in their order, so nothing else of the unverified result
    (`content`, `result`, ...) travels on."""
    rebuilt = {
        key: record if key == "output" else value
        for key, value in output.items()
        if key in OUTPUT_FIELDS
    }
    rebuilt.setdefault("output", record)
    return rebuilt


def rejection(verdict: Verdict, **extra: Any) -> dict[str, Any]:
    """The API error body for a blocked request (also a WebSocket error event's `error`);
    `extra` adds fields after `findings` (the `request_id`). It lists the findings
    `Verdict.listed` keeps, and `findings_omitted` when it left some out."""
    blocking = [f for f in verdict.findings if f.action == "block"] or list(verdict.findings)
    first = blocking[0]
    message = first.describe()
    if verdict.note is not None:
        message = f"{verdict.note}. {message}"
    if len(verdict.findings) > 1:
        message += f" (and {len(verdict.findings) - 1} more finding"
        message += "s)" if len(verdict.findings) > 2 else ")"
    listed, omitted = verdict.listed()
    counted = {"findings_omitted": omitted} if omitted else {}
    return error_document(
        "invalid_request_error",
        "replay_rejected",
        message,
        first.where,
        findings=[f.as_dict() for f in listed],
        **counted,
        **extra,
    )


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None
