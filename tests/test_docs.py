"""The docs: the generated reference pages are what the code says now, and every relative link
of README.md and docs/*.md points to a file (and a heading) that exists."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.running.config_file import MEANINGS
from proxy.running.reference import BEGIN, COMMAND, DETAILS, END, PAGES, iter_stale, render

ROOT = Path(__file__).resolve().parents[1]
PAGES_WITH_LINKS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), outside code spans; a target without a scheme is relative.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_generated_pages_are_current(name: str) -> None:
    path = ROOT / name
    text = path.read_text(encoding="utf-8")
    assert text == render(text, PAGES[name]()), f"{name} is out of date: run {COMMAND}"


def test_a_stale_page_is_found_and_named(tmp_path: Path) -> None:
    for name in PAGES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    assert list(iter_stale(tmp_path)) == []
    page = tmp_path / "docs" / "metrics.md"
    page.write_text(page.read_text(encoding="utf-8").replace("| counter |", "| gauge |", 1))
    assert list(iter_stale(tmp_path)) == ["docs/metrics.md"]


def test_the_command_checks_the_pages_in_the_tree() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.running.reference", "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_render_replaces_only_what_stands_between_the_markers() -> None:
    page = f"# t\n\nbefore\n{BEGIN}\nold\n{END}\nafter\n"
    assert render(page, "new\n") == f"# t\n\nbefore\n{BEGIN}\nnew\n{END}\nafter\n"
    with pytest.raises(ValueError, match="needs one"):
        render("no markers\n", "new\n")


def test_the_details_name_only_keys_of_the_config() -> None:
    assert set(DETAILS) <= set(MEANINGS)


def test_the_tables_have_every_key_and_every_family() -> None:
    config = (ROOT / "docs" / "configuration-reference.md").read_text(encoding="utf-8")
    for key in MEANINGS:
        assert f"| `{key}` |" in config, key
    assert "| `ledger.max_responses` | `25000` |" in config
    assert "| `listen.shutdown_grace_s` | `30` |" in config
    assert "| `upstream.api_key_env` | none |" in config


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    text = _without_code_blocks(path.read_text(encoding="utf-8"))
    return {_slug(line.lstrip("#").strip()) for line in text.splitlines() if line.startswith("#")}


def _slug(heading: str) -> str:
    heading = unicodedata.normalize("NFKC", heading).lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def iter_links(path: Path) -> Iterator[str]:
    text = _CODE.sub("", path.read_text(encoding="utf-8"))
    for found in _LINK.finditer(text):
        target = found.group(1)
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("page", PAGES_WITH_LINKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_something_that_exists(page: Path) -> None:
    broken = []
    for target in iter_links(page):
        file, _, anchor = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_the_link_checker_can_fail() -> None:
    assert _slug("The model's own calls (door 2)") == "the-models-own-calls-door-2"
    assert _slug("`replay-proxy check`") == "replay-proxy-check"
    assert "keys-and-clients" in anchors(ROOT / "docs" / "operations.md")
    assert "admin-endpoints" in anchors(ROOT / "docs" / "operations.md")


def test_the_picture_of_where_it_sits_is_drawn_and_shown() -> None:
    """README shows docs/where-it-sits.svg, a hand-written SVG (its own source) that parses and
    names each part: the clients, the proxy, the providers, the ledger and the audit log."""
    svg = ROOT / "docs" / "where-it-sits.svg"
    assert "docs/where-it-sits.svg" in set(iter_links(ROOT / "README.md"))
    root = ET.parse(svg).getroot()
    texts = {el.text for el in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {"clients", "replay-proxy", "providers", "the ledger", "the audit log"} <= texts
