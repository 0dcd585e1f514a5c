"""The AI SDK clients (Node, tests/clients/aisdk): one script run against the proxy or an
upstream, without blocking the event loop the proxy under test serves on."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1] / "clients" / "aisdk"
INSTALL = "npm ci --prefix tests/clients/aisdk"


async def run_script(script: str, provider: str, *args: str) -> tuple[int | None, str, str]:
    """`node <script> <args>` in the client's project: its exit status, output and errors.
    `provider` is the package under `@ai-sdk/` the script needs."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not installed (it runs the AI SDK client; then: {INSTALL})")
    if not (PROJECT / "node_modules" / "@ai-sdk" / provider).is_dir():
        pytest.fail(f"the AI SDK client is not installed: run `{INSTALL}`")
    process = await asyncio.create_subprocess_exec(
        node,
        str(PROJECT / script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    return process.returncode, out.decode(), err.decode(errors="replace")
