"""The replay-proxy source trees a comparison serves: revisions exported from git, the working
tree, or directories that hold a `proxy` package. A tree other than the working tree is served
with `python -P` and `PYTHONPATH` set to it, so that it imports its own `proxy`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from host import ROOT


def export(revision: str, into: Path) -> str:
    """The tree of `revision` under `into`; returns its short hash."""
    short = (
        subprocess.run(
            ["git", "rev-parse", "--short", revision], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    archive = subprocess.run(
        ["git", "archive", revision, "proxy"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return short


def source_trees(
    into: Path, base: str | None, head: str | None, extra: list[str]
) -> dict[str, Path | None]:
    """The replay-proxy trees a comparison serves, by name: `base` and `head` exported under
    `into` (`head` None: the working tree, as installed), then each directory of `extra` (one
    holding a `proxy` package)."""
    trees: dict[str, Path | None] = {}
    if base is not None:
        (into / "base").mkdir()
        trees[f"proxy {export(base, into / 'base')}"] = into / "base"
    if head is None:
        trees["proxy tree"] = None
    else:
        (into / "head").mkdir()
        trees[f"proxy {export(head, into / 'head')}"] = into / "head"
    for directory in extra:
        trees[f"proxy {directory}"] = Path(directory).resolve()
    return trees
