"""Fixtures of the Envoy tests: a real `replay-proxy extproc` and a real Envoy in front of an
upstream, both on free loopback ports, with the config `serve` is compared under."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.extproc.envoy import Envoy, Extproc
from tests.extproc.fronts import Emitting
from tests.servers.recording import RecordingUpstream

MiB = 1024 * 1024
# One config for the block, strip, rewrite and log cases: a reason per action.
SECTIONS: dict[str, Any] = {
    "gate": {
        "action": "block",
        "actions": {"status": "strip", "arguments_parse": "rewrite", "namespaced": "log"},
    },
    "limits": {"max_body_bytes": MiB},
}
# The processor never sends a request upstream (Envoy does): its upstreams' URLs are not used.
NOWHERE = "http://127.0.0.1:9"


def routed(url: str) -> dict[str, Any]:
    """SECTIONS in the form with routes, every upstream at `url`: the route under `/acme` to
    upstream `acme` that deploy/envoy/envoy.yaml shows, one under `/team` that it has no route
    of its own for, and the default route."""
    return SECTIONS | {
        "upstreams": {"default": {"url": url}, "acme": {"url": url}},
        "routes": [
            {"path_prefix": "/acme", "upstream": "acme"},
            {"path_prefix": "/team", "upstream": "default"},
            {"upstream": "default"},
        ],
    }


@dataclass
class BehindEnvoy:
    """Envoy in front of an upstream, with a processor: where clients go, and the audit log."""

    url: str
    envoy: Envoy
    processor: Extproc
    audit: Path


def write_config(path: Path, audit: Path, sections: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({**sections, "audit": {"path": str(audit)}}), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def house_processor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extproc]:
    """One `replay-proxy extproc` under SECTIONS, with routes, for every test that does not
    stop it."""
    directory = tmp_path_factory.mktemp("extproc")
    config = write_config(directory / "config.yaml", directory / "audit.jsonl", routed(NOWHERE))
    processor = Extproc(directory, config, directory / "audit.jsonl")
    processor.start()
    yield processor
    processor.stop()


@pytest.fixture
async def behind_envoy(
    tmp_path: Path, house_processor: Extproc
) -> AsyncIterator[Callable[..., Any]]:
    """Start Envoy in front of `upstream` (a base URL), with the house processor or, given
    config sections, a processor of its own (which a test may stop)."""
    started: list[Envoy | Extproc] = []

    async def start(upstream: str, /, **sections: Any) -> BehindEnvoy:
        processor = house_processor
        if sections:
            audit = tmp_path / "audit.jsonl"
            config = write_config(tmp_path / "config.yaml", audit, SECTIONS | sections)
            processor = Extproc(tmp_path, config, audit)
            started.append(processor)
            await asyncio.to_thread(processor.start)
        parts = urlsplit(upstream)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        limit = (SECTIONS | sections)["limits"]["max_body_bytes"]
        envoy = Envoy(tmp_path, address, processor.port, limit)
        started.append(envoy)
        await asyncio.to_thread(envoy.start)
        return BehindEnvoy(envoy.url, envoy, processor, processor.audit)

    yield start
    for process in reversed(started):
        await asyncio.to_thread(process.stop)


@pytest.fixture
def emitting(recording_upstream: RecordingUpstream) -> Emitting:
    """The recording upstream, answering a request with BAD_CALL's header with a failing call."""
    emitting = recording_upstream.handler = Emitting(recording_upstream)
    recording_upstream.answer_frame = emitting.frames
    return emitting
