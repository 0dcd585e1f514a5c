"""The Codex CLI (`codex exec`, HTTP transport, Responses wire API) through the proxy: one turn
in which the scripted upstream calls Codex's own `exec_command` tool, Codex runs it, and the
upstream answers with what the tool said; the same final output as direct."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixture_types import ProxyFactory

PROJECT = Path(__file__).resolve().parents[1] / "clients" / "codex"
INSTALL = "npm ci --prefix tests/clients/codex"
CODEX = PROJECT / "node_modules" / ".bin" / "codex"
PROMPT = 'call exec_command with {"cmd":"echo tool-turn-ran"}'


def configure(base: str, home: Path, workdir: Path) -> None:
    """A CODEX_HOME whose one provider is `base` (its /v1), and an empty working directory."""
    if not CODEX.exists():
        pytest.fail(f"the Codex CLI is not installed: run `{INSTALL}`")
    home.mkdir()
    workdir.mkdir()
    (home / "config.toml").write_text(
        'model = "scripted"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\n'
        f'name = "scripted"\nbase_url = "{base}/v1"\nwire_api = "responses"\n'
        'env_key = "SCRIPTED_KEY"\n',
        encoding="utf-8",
    )


async def codex_exec(base: str, home: Path, workdir: Path) -> str:
    """`codex exec` with a provider at `base`; the last message Codex prints."""
    configure(base, home, workdir)
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CODEX_HOME": str(home)}
    # Run without blocking the event loop: the proxy under test serves on this same loop.
    process = await asyncio.create_subprocess_exec(
        str(CODEX),
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "danger-full-access",
        "--output-last-message",
        str(workdir / "last.txt"),
        PROMPT,
        cwd=workdir,
        env=environment | {"SCRIPTED_KEY": "sk-test"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")
    return (workdir / "last.txt").read_text(encoding="utf-8")


async def test_a_codex_tool_turn_through_the_proxy_is_as_direct(
    scripted_upstream: str, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    direct = await codex_exec(scripted_upstream, tmp_path / "home-direct", tmp_path / "direct")
    assert "tool-turn-ran" in direct

    base = await start_proxy(scripted_upstream)
    proxied = await codex_exec(base, tmp_path / "home-proxied", tmp_path / "proxied")

    # The tool's own output, after the lines Codex varies per run (chunk id, wall time).
    assert proxied.partition("Output:")[2] == direct.partition("Output:")[2] == "\ntool-turn-ran\n"
    audit = tmp_path / "audit.jsonl"
    assert not audit.exists() or "replay_rejected" not in audit.read_text(encoding="utf-8")
