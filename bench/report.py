"""Benchmark reports: Markdown tables, and each script's own section of docs/performance.md."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
_TITLE = (
    "# Performance\n\n"
    "Written by the benchmarks in `bench/`, run from the repository root: "
    "`python bench/gate_cost.py` (the gate in-process) and `python bench/load.py` (under load; "
    "needs `wrk`). Each rewrites its own section; `--quick` gives a shorter run.\n"
)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; the first column left-aligned, the others right-aligned."""
    align = [":---", *["---:"] * (len(headers) - 1)]
    lines = [headers, align, *rows]
    return "".join("| " + " | ".join(line) + " |\n" for line in lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_section(name: str, text: str, doc: Path = DOC) -> Path:
    """Replace (or add) the section `name` of the performance document, keeping the others."""
    begin, end = f"<!-- begin {name} -->\n", f"<!-- end {name} -->\n"
    current = doc.read_text(encoding="utf-8") if doc.exists() else _TITLE
    section = begin + text.rstrip("\n") + "\n" + end
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        _, tail = rest.split(end, 1)
        updated = head + section + tail
    else:
        updated = current.rstrip("\n") + "\n\n" + section
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(updated, encoding="utf-8")
    return doc
