"""The table of metrics in docs/metrics.md (generated from the registry) lists exactly the
metrics a scrape shows, with their types and labels."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import at, clean_body, failing_body
from tests.fixture_types import ProxyFactory
from tests.server.checks import scrape
from tests.servers.recording import RecordingUpstream

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"\| `([a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|")


def page_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/metrics.md's table: each metric's name (as a scrape's `# TYPE` line names it), its
    type and its label names."""
    found = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        row = _ROW.match(line)
        if row is not None:
            name, kind, labels = row.groups()
            found[name] = (kind, frozenset(re.findall(r"`([a-z_]+)`", labels)))
    return found


def scraped_metrics(text: str) -> dict[str, tuple[str, frozenset[str] | None]]:
    """Each family of a scrape, its type, and the label names of its samples (None: none)."""
    found: dict[str, tuple[str, frozenset[str] | None]] = {}
    for family in text_string_to_metric_families(text):
        # The parser names a counter without `_total`; the `# TYPE` line and the page with it.
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {key for sample in family.samples for key in sample.labels if key != "le"}
        found[name] = (family.type, frozenset(labels) if family.samples else None)
    return found


def test_the_table_is_read() -> None:
    # The parser of the table must be able to fail: it finds rows it knows are there.
    table = page_metrics()
    assert table["replay_proxy_requests_total"] == (
        "counter",
        frozenset({"route", "outcome", "upstream", "dialect"}),
    )
    assert table["replay_proxy_gate_seconds"] == ("histogram", frozenset())


async def test_the_page_lists_exactly_the_metrics_a_scrape_shows(
    recording_upstream: RecordingUpstream, start_proxy: ProxyFactory, client: aiohttp.ClientSession
) -> None:
    base = await start_proxy(recording_upstream.url)
    for body in (clean_body(), failing_body()):
        async with client.post(at(base, "/v1/responses"), json=body) as resp:
            await resp.read()

    scraped = scraped_metrics(await scrape(client, base))
    table = page_metrics()

    assert {name: kind for name, (kind, _) in scraped.items()} == {
        name: kind for name, (kind, _) in table.items()
    }
    for name, (_, labels) in scraped.items():
        if labels is not None:
            assert labels == table[name][1], name
