"""The audit report as one self-contained HTML page: inline CSS, SVG and script, no fetch."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from html import escape

from proxy.running.report import (
    EMITTED,
    MAX_LISTED,
    NONE,
    CountRow,
    Entry,
    Summary,
    bucket_label,
    iso,
    key,
    percent,
    shown,
    timestamp,
)

# Colour-blind-safe (Okabe-Ito, then Tableau) colours, given to the reasons in rank order.
PALETTE = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#cc79a7",
    "#56b4e9",
    "#f0e442",
    "#7f7f7f",
    "#8c564b",
    "#17becf",
)
OTHER = "#bbbbbb"
CHART_W, CHART_H = 1100, 300
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 48
MAX_X_LABELS = 12
LABEL_CHAR_W = 6.5

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; margin: 4px 0 12px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: flex; flex-wrap: wrap; gap: 0 36px; align-items: flex-start; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; }
.note { color: #666; }
code { font-size: 13px; }
.figures { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.figure { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
.figure strong { display: block; font-size: 26px; font-variant-numeric: tabular-nums; }
.figure span { color: #555; font-size: 13px; }
.figure.alarm strong { color: #b00020; }
td.msg { max-width: 640px; }
#find { font: inherit; padding: 4px 8px; width: 360px; }
#records td { vertical-align: top; }
#records td.when { white-space: nowrap; }
#records pre { margin: 4px 0; font-size: 12px; white-space: pre-wrap; max-width: 900px; }
tr.hit { background: #fff6d5; }
"""

# The page's one script, a constant (no value of a record is in it): the search box shows only
# the listed records whose request id contains what is typed (the page's #fragment fills it),
# opens the record of an exact match and scrolls to the first match.
SCRIPT = """
(function () {
  var box = document.getElementById("find");
  var list = document.getElementById("records-list");
  var said = document.getElementById("found");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#records tbody tr"));
  function find() {
    var q = box.value.trim();
    var hits = 0, first = null;
    rows.forEach(function (row) {
      var id = row.getAttribute("data-id");
      var hit = q !== "" && id.indexOf(q) !== -1;
      row.hidden = q !== "" && !hit;
      row.className = hit ? "hit" : "";
      row.querySelector("details").open = q !== "" && id === q;
      if (hit) { hits += 1; first = first || row; }
    });
    said.textContent = q === "" ? "" : hits + " record(s) with a request id containing " + q;
    if (first) { list.open = true; first.scrollIntoView(); }
  }
  box.addEventListener("input", find);
  if (location.hash.length > 1) { box.value = decodeURIComponent(location.hash.slice(1)); find(); }
})();
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def colours(summary: Summary) -> dict[str | None, str]:
    """A colour per reason, the most frequent first."""
    return {t.key: PALETTE[i] if i < len(PALETTE) else OTHER for i, t in enumerate(summary.reasons)}


def _tally_table(
    title: str, rows: Iterable[CountRow], label: Callable[[str | None], str] = shown
) -> Iterator[str]:
    yield (
        f'<table><tr><th>{_e(title)}</th><th class="n">requests</th>'
        '<th class="n">findings</th></tr>'
    )
    for r in rows:
        yield (
            f'<tr><td>{_e(label(r.key))}</td><td class="n">{r.requests}</td>'
            f'<td class="n">{r.findings}</td></tr>'
        )
    yield "</table>"


def chart_label(summary: Summary, start: datetime) -> str:
    """A bar's label: without the date when every record is of one day and a bar is shorter."""
    label = bucket_label(start, summary.width)
    first, last = summary.first, summary.last
    if first is None or last is None or first.date() != last.date():
        return label
    return label.partition(" ")[2] if summary.width < timedelta(days=1) else label


def time_chart(summary: Summary) -> str:
    """Findings per bucket as bars stacked by reason, an SVG drawn on a fixed canvas."""
    colour = colours(summary)
    totals = [sum(n for _, n in counts) for _, counts in summary.timeline]
    top = max(totals, default=0) or 1
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM
    slot = plot_w / max(len(summary.timeline), 1)
    bar = max(slot * 0.8, 1.0)
    out = [
        (
            f'<svg width="{CHART_W}" height="{CHART_H}" '
            f'viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
            f'aria-label="findings per {_e(summary.bucket)} by reason">'
        )
    ]
    for tick in (0, top / 2, top):
        y = TOP + plot_h - tick / top * plot_h
        out.append(
            f'<line x1="{LEFT}" x2="{CHART_W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{tick:g}</text>"
        )
    # Every how many bars a label fits beside the next (at about LABEL_CHAR_W a character).
    widest = max((len(chart_label(summary, start)) for start, _ in summary.timeline), default=0)
    label_w = widest * LABEL_CHAR_W + 12
    every = max(1, -(-len(summary.timeline) // MAX_X_LABELS), math.ceil(label_w / slot))
    labelled = -label_w  # where the last label was written
    for i, (start, counts) in enumerate(summary.timeline):
        x = LEFT + i * slot + (slot - bar) / 2
        y = TOP + plot_h
        label = chart_label(summary, start)
        for reason, n in counts:
            h = n / top * plot_h
            y -= h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour.get(reason, OTHER)}"><title>{_e(label)}: '
                f"{_e(shown(reason))} {n}</title></rect>"
            )
        middle = min(x + bar / 2, CHART_W - label_w / 2)  # the last one inside the canvas
        if i % every == 0 and middle - labelled >= label_w:
            labelled = middle
            out.append(
                f'<text x="{middle:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                f'font-size="11">{_e(label)}</text>'
            )
    out.append(
        f'<line x1="{LEFT}" x2="{CHART_W - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" '
        'stroke="#888"/></svg>'
    )
    return "".join(out)


def tool_chart(summary: Summary) -> str:
    """Findings per tool as horizontal bars, each split by reason."""
    colour = colours(summary)
    rows = summary.per_tool
    row_h, label_w, width = 22, 260, CHART_W
    height = row_h * len(rows) + 8
    top = max((t.findings for t in rows), default=0) or 1
    plot_w = width - label_w - 60
    out = [
        (
            f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="findings per tool by reason">'
        )
    ]
    for i, tool in enumerate(rows):
        y = 4 + i * row_h
        out.append(
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" font-size="12">'
            f"{_e(shown(tool.name))}</text>"
        )
        x = float(label_w)
        for reason, n in tool.reasons:
            w = n / top * plot_w
            out.append(
                f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{row_h - 6}" '
                f'fill="{colour.get(reason, OTHER)}"><title>{_e(shown(tool.name))}: '
                f"{_e(shown(reason))} {n}</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + 15}" font-size="12">{tool.findings}</text>')
    out.append("</svg>")
    return "".join(out)


def _legend(summary: Summary) -> str:
    colour = colours(summary)
    spans = "".join(
        f'<span><i style="background:{colour[t.key]}"></i>{_e(shown(t.key))}</span>'
        for t in summary.reasons
    )
    return f'<p class="legend">{spans}</p>'


def render_html(summary: Summary) -> str:
    """The whole page; every value that came from a record is escaped."""
    out = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        "<title>replay-proxy audit report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>replay-proxy audit report</h1>",
        (
            f"<p>{summary.records} records, {summary.findings} findings, from "
            f"{len(summary.files)} file(s): {_e(', '.join(summary.files))}</p>"
        ),
    ]
    if summary.first is not None and summary.last is not None:
        out.append(
            f"<p>from {_e(iso(summary.first))} to {_e(iso(summary.last))}, counted per "
            f"{_e(summary.bucket)} (UTC)</p>"
        )
    out.append(figures(summary))
    out.append(
        '<p><label>Find a record by request id: <input id="find" type="search" '
        'placeholder="req_…" autocomplete="off"></label> <span id="found" class="note"></span></p>'
    )
    if summary.undated:
        out.append(
            f'<p class="note">{summary.undated} record(s) without a readable ts: '
            "not in the time chart</p>"
        )
    if summary.unreadable:
        out.append(f"<h2>Unreadable lines ({len(summary.unreadable)})</h2><ul>")
        out.extend(
            f"<li><code>{_e(u.file)}:{u.line}</code>: {_e(u.reason)}</li>"
            for u in summary.unreadable
        )
        out.append("</ul>")
    out.append(f"<h2>Findings per {_e(summary.bucket)}, by reason</h2>")
    out.append(_legend(summary))
    out.append(time_chart(summary))
    out.append("<h2>Reasons, with sample messages</h2>")
    out.extend(_reasons_table(summary))
    out.append("<h2>Findings per tool</h2>")
    out.append(tool_chart(summary))
    out.append('<h2>Counts</h2><div class="grid">')
    for title, rows in (
        ("tool", summary.tools),
        ("upstream", summary.upstreams),
        ("action", summary.actions),
        ("event", summary.events),
        ("dialect", summary.dialects),
        ("path", summary.request_paths),
    ):
        out.extend(_tally_table(title, rows))
    out.extend(_tally_table("tenant", summary.tenants, summary.tenant))
    out.append("</div>")
    wb = summary.would_block
    out.append("<h2>What <code>block</code> would have blocked</h2>")
    if wb.requests:
        out.append(
            f"<p>{wb.requests} request(s) with action <code>log</code> were forwarded with "
            f"{wb.findings} finding(s); each would have been answered 400 under "
            "<code>block</code>. The latest: "
            f"{_e(', '.join(shown(i) for i in wb.request_ids))}</p>"
        )
        out.append('<div class="grid">')
        out.extend(_pairs_table("reason", wb.reasons))
        out.extend(_pairs_table("tool", wb.tools))
        out.append("</div>")
    else:
        out.append("<p>Nothing: no record has action <code>log</code>.</p>")
    mc = summary.model_calls
    if mc.responses:
        out.append("<h2>The model's own calls that failed their schema</h2>")
        out.append(
            f"<p>{mc.calls} call(s) in {mc.responses} response(s) "
            f"(<code>{EMITTED}</code>), relayed as the upstream sent them.</p>"
        )
        out.append('<div class="grid">')
        out.extend(_pairs_table("reason", mc.reasons))
        out.extend(_pairs_table("tool", mc.tools))
        out.append("</div>")
    if summary.top_paths:
        out.append("<h2>Top failing argument paths</h2><table>")
        out.append('<tr><th>tool</th><th>path</th><th>keyword</th><th class="n">findings</th></tr>')
        out.extend(
            f"<tr><td>{_e(shown(tool))}</td><td><code>{_e(shown(path) or '/')}</code></td>"
            f'<td>{_e(shown(reason))}</td><td class="n">{n}</td></tr>'
            for tool, path, reason, n in summary.top_paths
        )
        out.append("</table>")
    out.append("<h2>Per tool</h2>")
    for tool in summary.per_tool:
        out.append(
            f"<h3>{_e(shown(tool.name))}: {tool.findings} finding(s) in "
            f"{tool.requests} request(s)</h3>"
        )
        out.append('<div class="grid">')
        out.extend(_pairs_table("reason", tool.reasons))
        if tool.paths:
            out.append('<table><tr><th>path</th><th>keyword</th><th class="n">findings</th></tr>')
            out.extend(
                f"<tr><td><code>{_e(shown(path) or '/')}</code></td><td>{_e(shown(reason))}"
                f'</td><td class="n">{n}</td></tr>'
                for path, reason, n in tool.paths
            )
            out.append("</table>")
        out.append("</div>")
    out.extend(_records(summary))
    out.append(f'<p class="note">{_e(NONE)}: no value in the record.</p>')
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"


def _figure(label: str, value: object, *, alarm: bool = False) -> str:
    kind = "figure alarm" if alarm else "figure"
    return f'<div class="{kind}"><strong>{_e(value)}</strong><span>{_e(label)}</span></div>'


def figures(summary: Summary) -> str:
    """The headline figures: what the records count by action, and with a metrics scrape the
    requests judged and the rejection rate."""
    h = summary.headline
    cards = []
    judged = summary.judged
    if judged is not None:
        cards.append(_figure("requests judged", judged.total))
        cards.append(
            _figure(
                f"rejection rate ({judged.blocked} blocked)",
                percent(judged.blocked, judged.total),
                alarm=judged.blocked > 0,
            )
        )
    cards += [
        _figure("requests with findings", h.requests),
        _figure("blocked", h.blocked, alarm=h.blocked > 0),
        _figure("stripped", h.stripped),
        _figure("rewritten", h.rewritten),
        _figure("logged", h.logged),
        _figure("would have blocked (log mode)", h.would_block, alarm=h.would_block > 0),
    ]
    source = (
        f'<p class="note">requests judged: from {_e(judged.source)} '
        "(<code>replay_proxy_requests_total</code> on the gated routes)</p>"
        if judged is not None
        else ""
    )
    return f'<div class="figures">{"".join(cards)}</div>{source}'


def _reasons_table(summary: Summary) -> Iterator[str]:
    samples = dict(summary.samples)
    colour = colours(summary)
    yield (
        '<table><tr><th>reason</th><th class="n">requests</th><th class="n">findings</th>'
        "<th>sample messages</th></tr>"
    )
    for r in summary.reasons:
        said = "<br>".join(_e(m) for m in samples.get(r.key, ()))
        yield (
            f'<tr><td><i style="display:inline-block;width:10px;height:10px;'
            f'background:{colour[r.key]}"></i> {_e(shown(r.key))}</td>'
            f'<td class="n">{r.requests}</td><td class="n">{r.findings}</td>'
            f'<td class="msg">{said}</td></tr>'
        )
    yield "</table>"


def _records(summary: Summary) -> Iterator[str]:
    """The listed records, newest first, that the search box at the top filters."""
    yield "<h2>Records</h2>"
    cut = summary.records - len(summary.listed)
    if cut:
        yield (
            f'<p class="note">The newest {MAX_LISTED} records are listed here; '
            f"<code>replay-proxy audit report --request-id ID</code> finds any.</p>"
        )
    yield f'<details id="records-list"><summary>{len(summary.listed)} record(s)</summary>'
    yield (
        '<table id="records"><thead><tr><th>ts</th><th>request id</th><th>action</th>'
        "<th>tenant</th><th>findings</th></tr></thead><tbody>"
    )
    yield from (_record_row(summary, entry) for entry in reversed(summary.listed))
    yield "</tbody></table></details>"


def _record_row(summary: Summary, entry: Entry) -> str:
    rec = entry.record
    request_id = rec.get("request_id")
    rid = request_id if isinstance(request_id, str) else shown(None)
    ts = timestamp(rec.get("ts"))
    found = [f for f in rec["findings"] if isinstance(f, dict)]
    said = "<br>".join(
        _e(f"{shown(key(f.get('reason')))}: {key(f.get('message')) or ''}") for f in found
    )
    tenant = rec.get("tenant")
    event = "" if rec.get("event") != EMITTED else f" ({EMITTED})"
    action = shown(key(rec.get("action")))
    return (
        f'<tr data-id="{_e(rid)}"><td class="when">{_e(iso(ts) if ts else shown(None))}</td>'
        f'<td class="when"><code>{_e(rid)}</code></td><td>{_e(action)}{event}</td>'
        f"<td>{_e(summary.tenant(key(tenant)))}</td><td>{said}"
        f"<details><summary>{_e(entry.file)}:{entry.line}</summary>"
        f"<pre>{_e(json.dumps(rec, indent=2))}</pre></details></td></tr>"
    )


def _pairs_table(title: str, rows: Iterable[tuple[str | None, int]]) -> Iterator[str]:
    yield f'<table><tr><th>{_e(title)}</th><th class="n">findings</th></tr>'
    for k, n in rows:
        yield f'<tr><td>{_e(shown(k))}</td><td class="n">{n}</td></tr>'
    yield "</table>"
