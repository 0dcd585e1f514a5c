"""`audit report --html`: one page, self-contained and escaped, read in a real headless Chromium."""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from proxy.running.report import Entry, summarize
from proxy.running.report_html import PALETTE, SCRIPT, render_html
from proxy.state.audit import AuditedRequest, record
from tests.builders import (
    FINDING,
    audit_record,
    call,
    failing_body,
    orphan_finding,
    output,
    request,
)
from tests.state.audit_logs import ORPHAN_BODY, replay_proxy

CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>alert("x")</script>'


class Page(HTMLParser):
    """The tags, attributes and text of a page, as a browser's parser sees them; and the
    records' rows of its search, by request id, with whether each is shown and open."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.texts: list[str] = []
        self.scripts: list[str] = []
        self.rows: dict[str, tuple[bool, bool]] = {}
        self._row: str | None = None
        self._in_script = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes.extend(attrs)
        named = dict(attrs)
        self._in_script = tag == "script"
        if tag == "tr" and "data-id" in named:
            self._row = named["data-id"] or ""
            self.rows[self._row] = ("hidden" not in named, False)
        elif tag == "details" and self._row is not None:
            self.rows[self._row] = (self.rows[self._row][0], "open" in named)
            self._row = None

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)
        else:
            self.texts.append(data)

    @property
    def text(self) -> str:
        return " ".join(self.texts)


def hostile_records() -> list[dict[str, Any]]:
    """Records whose client-given values (tool, path, tenant, upstream) are markup."""
    bad = FINDING | {"name": HOSTILE, "fail": [{"path": f"/{HOSTILE}", "reason": "enum"}]}
    return [
        audit_record("2026-11-29T09:15:00Z", bad, tenant=HOSTILE, upstream='"><b>x'),
        audit_record("2026-11-29T11:15:00Z", orphan_finding(), action="log", path=HOSTILE),
        audit_record("2026-11-29T11:45:00Z"),
    ]


# Five ways a replay fails, each a body the gate really judges: the records carry its messages.
FAILING_BODIES = (
    failing_body(),
    request(call("c1", '{"region": 5}'), output("c1")),
    ORPHAN_BODY,
    request(call("c2", status="in_progress"), output("c2")),
    request(call("c3", name="refund_order"), output("c3")),
)
TENANTS = ("t_0123456789abcdef", "t_fedcba9876543210", "t_00aa11bb22cc33dd")


def records_over(start: datetime, span: timedelta, count: int) -> list[dict[str, Any]]:
    """`count` audit records spread over `span` as the proxy writes them, most in `log` mode (a
    roll-out), every third blocked; request ids `req_<n>`."""
    out = []
    for n in range(count):
        body = FAILING_BODIES[(n * n + n // 3) % len(FAILING_BODIES)]
        verdict = inspect(body, Policy())
        rec = record(
            AuditedRequest(f"req_{n:04d}", "http", "/v1/responses", body, b"{}", TENANTS[n % 3]),
            verdict,
            include_arguments=False,
        )
        ts = start + span * (n / max(count - 1, 1))
        rec["ts"] = ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        rec["action"] = "block" if n % 3 == 0 else "log"
        out.append(rec)
    return out


START = datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC)
# A six-second roll-out, and two days of records: each drawn in bars that fit its span.
SIZES = {
    "six-second-rollout": (records_over(START, timedelta(seconds=6), 90), "second", 7),
    "two-days": (records_over(START, timedelta(days=2), 800), "hour", 49),
}


def page_of(records: list[dict[str, Any]]) -> str:
    entries = [Entry("audit.jsonl", n, r) for n, r in enumerate(records, 1)]
    return render_html(summarize(["audit.jsonl"], entries))


@pytest.mark.parametrize(
    ("where", "value"),
    [
        pytest.param("tool", HOSTILE, id="tool"),
        pytest.param("argument-path", f"/{HOSTILE}", id="argument-path"),
        pytest.param("tenant", HOSTILE, id="tenant"),
        pytest.param("upstream", '"><b>x', id="upstream-breaking-out-of-an-attribute"),
    ],
)
def test_every_value_from_a_record_is_escaped(where: str, value: str) -> None:
    html = page_of(hostile_records())
    page = Page(html)
    assert page.scripts == [SCRIPT], where  # the page's own, and no other
    assert "b" not in page.tags, where
    assert value in page.text, where  # shown as text, as it was written


def test_the_page_fetches_nothing_and_its_one_script_is_its_own() -> None:
    html = page_of(hostile_records())
    page = Page(html)
    assert not {"link", "img", "iframe", "object", "embed"} & set(page.tags)
    assert not [name for name, _ in page.attributes if name in {"src", "href", "srcset"}]
    assert "url(" not in html
    assert "://" not in html  # no address of any kind
    assert page.tags.count("svg") == 2
    # One inline script, a constant: no value of a record is written into it.
    assert page.scripts == [SCRIPT]
    assert "fetch" not in SCRIPT
    assert "XMLHttpRequest" not in SCRIPT


def rgb_pixels(png: bytes) -> Counter[tuple[int, int, int]]:
    """The colours of a plain 8-bit RGB or RGBA PNG, decoded with zlib."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = data
        elif kind == b"IDAT":
            chunks.append(data)
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, colour_type, interlace) in {(8, 2, 0), (8, 6, 0)}, header
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    colours: Counter[tuple[int, int, int]] = Counter()
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                guess = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                row[i] = (row[i] + guess) & 0xFF
        colours.update((row[x], row[x + 1], row[x + 2]) for x in range(0, stride, channels * 4))
        previous = row
    return colours


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: the HTML report is tested in Debian's headless Chromium; "
        "install it with `apt-get install -y chromium`"
    )
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1200,1600",
            *args,
        ],
        capture_output=True,
        timeout=90,
        check=True,
    )


def screenshot(tmp_path: Path, page: Path, shot: Path) -> Counter[tuple[int, int, int]]:
    """The page as Chromium draws it; fails when it draws nothing or draws no chart."""
    chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    colours = rgb_pixels(shot.read_bytes())
    background, most = colours.most_common(1)[0]
    assert background == (255, 255, 255)
    assert sum(colours.values()) - most > sum(colours.values()) // 50, "the page is blank"
    # The most frequent reason's colour: the charts were drawn.
    hex_rgb = PALETTE[0]
    top_reason = (int(hex_rgb[1:3], 16), int(hex_rgb[3:5], 16), int(hex_rgb[5:7], 16))
    assert colours[top_reason] > 100, colours.most_common(8)
    return colours


@pytest.mark.parametrize("size", list(SIZES))
def test_the_time_chart_fits_the_span_in_a_browser(tmp_path: Path, size: str) -> None:
    records, bucket, bars = SIZES[size]
    summary = summarize(
        ["audit.jsonl"], [Entry("audit.jsonl", n, r) for n, r in enumerate(records)]
    )
    assert (summary.bucket, len(summary.timeline)) == (bucket, bars)
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "report.html"
    done = replay_proxy("audit", "report", "--html", str(out), str(log))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    screenshot(tmp_path, out, tmp_path / "shot.png")
    page = Page(chromium(tmp_path, "--dump-dom", out.as_uri()).stdout.decode())
    text = " ".join(page.text.split())
    assert f"Findings per {bucket}, by reason" in text
    # Headline figures: every third record blocked, the rest logged and so would-have-blocked.
    blocked = len(records[::3])
    assert f"{blocked} blocked" in text
    assert f"{len(records) - blocked} would have blocked (log mode)" in text
    assert len(page.rows) == len(records)


def test_the_search_shows_the_record_of_a_request_id(tmp_path: Path) -> None:
    records, _, _ = SIZES["six-second-rollout"]
    out = tmp_path / "report.html"
    out.write_text(page_of(records))
    # The fragment fills the search box, as typing the id in it does.
    dom = chromium(tmp_path, "--dump-dom", out.as_uri() + "#req_0042").stdout.decode()
    page = Page(dom)
    assert page.rows["req_0042"] == (True, True)  # shown, its record opened
    assert [rid for rid, (seen, _) in page.rows.items() if seen] == ["req_0042"]
    assert "1 record(s) with a request id containing req_0042" in page.text
    # A part of an id shows every record it is in, none opened.
    dom = chromium(tmp_path, "--dump-dom", out.as_uri() + "#req_001").stdout.decode()
    page = Page(dom)
    shown = sorted(rid for rid, (seen, _) in page.rows.items() if seen)
    assert shown == [f"req_{n:04d}" for n in range(10, 20)]
    assert not any(opened for _, opened in page.rows.values())


def test_the_page_in_a_headless_browser(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in hostile_records()))
    out = tmp_path / "report.html"
    done = replay_proxy("audit", "report", "--html", str(out), str(log))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    screenshot(tmp_path, out, tmp_path / "shot.png")

    dom = chromium(tmp_path, "--dump-dom", out.as_uri()).stdout.decode()
    page = Page(dom)
    # The hostile tool name stayed text in the browser too: the one script is the page's own.
    assert page.tags.count("script") == 1
    assert HOSTILE in page.text
    for reason in ("arguments_schema", "orphan"):
        assert reason in page.text
    assert "What block would have blocked" in " ".join(page.text.split())
