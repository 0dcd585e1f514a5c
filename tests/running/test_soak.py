"""The soak command, short: mixed load through a real proxy process, then every check holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_passes_every_check() -> None:
    done = subprocess.run(
        [sys.executable, "bench/soak.py", "--seconds", "3", "--concurrency", "8"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=REPO,
    )
    report = json.loads(done.stdout)
    assert report["checks"] == dict.fromkeys(report["checks"], True), report
    assert done.returncode == 0
    assert report["rejected"] > 0
    assert report["audit_records"] == report["rejected"]
