"""`audit report --html`: one page, self-contained and escaped, read in a real headless Chromium."""

from __future__ import annotations

import json
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from proxy.running.report import Entry, summarize
from proxy.running.report_html import PALETTE, render_html
from tests.builders import FINDING, audit_record, orphan_finding
from tests.state.audit_logs import replay_proxy

CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>alert("x")</script>'


class Page(HTMLParser):
    """The tags, attributes and text of a page, as a browser's parser sees them."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.texts: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes.extend(attrs)

    def handle_data(self, data: str) -> None:
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
    assert "script" not in page.tags, where
    assert "b" not in page.tags, where
    assert value in page.text, where  # shown as text, as it was written


def test_the_page_fetches_nothing_and_needs_no_script() -> None:
    html = page_of(hostile_records())
    page = Page(html)
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    assert not [name for name, _ in page.attributes if name in {"src", "href", "srcset"}]
    assert "url(" not in html
    assert "http" not in html
    assert page.tags.count("svg") == 2


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


def test_the_page_in_a_headless_browser(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in hostile_records()))
    out = tmp_path / "report.html"
    done = replay_proxy("audit", "report", "--html", str(out), str(log))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", out.as_uri())
    colours = rgb_pixels(shot.read_bytes())
    background, most = colours.most_common(1)[0]
    assert background == (255, 255, 255)
    assert sum(colours.values()) - most > sum(colours.values()) // 50, "the page is blank"
    # The most frequent reason's colour: the charts were drawn.
    hex_rgb = PALETTE[0]
    top_reason = (int(hex_rgb[1:3], 16), int(hex_rgb[3:5], 16), int(hex_rgb[5:7], 16))
    assert colours[top_reason] > 100, colours.most_common(8)

    dom = chromium(tmp_path, "--dump-dom", out.as_uri()).stdout.decode()
    page = Page(dom)
    assert "script" not in page.tags  # the hostile tool name stayed text in the browser too
    assert HOSTILE in page.text
    for reason in ("arguments_schema", "orphan"):
        assert reason in page.text
    assert "What block would have blocked" in " ".join(page.text.split())
