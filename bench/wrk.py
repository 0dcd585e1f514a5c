"""Driving one target with wrk: a Lua script per body, and one run measured from outside."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from host import minor_faults, process_cpu_seconds
from servers import memory_mb, pin_apart, reset_peak_rss, settle
from workload import HEADERS, PATH, Body

_LUA = """\
local file = assert(io.open([==[{path}]==], "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
{headers}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK_RESULT %d %d %d %d %d %d %d %.1f %.1f\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def write_script(
    directory: Path, index: int, body: Body, extra_headers: dict[str, str] | None = None
) -> Path:
    data_path = directory / f"body-{index}.json"
    data_path.write_bytes(body.data)
    sent = HEADERS | (extra_headers or {})
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in sent.items())
    script = directory / f"body-{index}.lua"
    script.write_text(_LUA.format(path=data_path, headers=headers), encoding="utf-8")
    return script


_NUMBERED = """\
local marker = [==[{marker}]==]
local at = assert(string.find(wrk.body, marker, 1, true))
local head, tail = wrk.body:sub(1, at - 1), wrk.body:sub(at + #marker)
-- Numbered on from the clock (100,000 a second), not from 0: a run after another (a warm-up,
-- then the counted run) sends none of the bodies the server has seen already.
local sent = (os.time() % 10 ^ ({width} - 5)) * 10 ^ 5
request = function()
  sent = sent + 1
  return wrk.format(nil, nil, nil, head .. string.format("%0{width}d", sent) .. tail)
end
"""


def write_numbered_script(directory: Path, index: int, body: Body, marker: str) -> Path:
    """`write_script`, but each request's body numbered: `marker` (digits, once in the body,
    at least 10 of them) replaced by a count of the requests sent, as wide, that starts from
    the clock (wrk's `-t1`: one count for all its connections). No two bodies are the same,
    in one run or in runs seconds apart, and all are of one size."""
    if body.data.count(marker.encode()) != 1 or not marker.isdigit() or len(marker) < 10:
        raise ValueError(f"{body.name}: the marker {marker!r} must be 10 digits or more, once")
    script = write_script(directory, index, body)
    numbered = _NUMBERED.format(marker=marker, width=len(marker))
    script.write_text(script.read_text("utf-8") + numbered, encoding="utf-8")
    return script


@dataclass
class Run:
    """One wrk run against one target: what wrk saw, and what the serving process spent."""

    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int  # connect/read/write/timeout (non-2xx answers are counted in `non_2xx`)
    non_2xx: int
    cpu_us: float  # per request served, over the steady window
    cpu_us_whole: float  # CPU from before wrk to idle after it, per request wrk completed
    window_requests: int
    window_rps: float  # requests served per second over the window (no ramp, no cut-off)
    peak_rss_mb: float
    others_cores: float = 0.0  # CPU other processes on the machine took meanwhile
    faults: float = float("nan")  # minor page faults per request served, over the window


def run_wrk(
    script: Path,
    url: str,
    pid: int,
    served: Callable[[], int],
    connections: int,
    duration_s: int,
) -> Run:
    """Drive `url` for `duration_s` and measure the serving process `pid` meanwhile.

    CPU per request is the CPU the process spent over a window inside the run divided by the
    requests it served in that window: wrk's start (connecting, the first bodies arriving)
    and end (up to `connections` requests cut off in flight, whose CPU would be charged to
    the finished ones: large for 1 MB bodies) stay outside. The process is pinned to a CPU of
    its own meanwhile (`pin_apart`).
    """
    argv = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url + PATH,
    ]
    pin_apart(pid)
    reset_peak_rss(pid)
    whole_start = process_cpu_seconds(pid)
    started_at = time.monotonic()
    wrk = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(min(1.0, duration_s * 0.25))
        served0, cpu0, t0 = served(), process_cpu_seconds(pid), time.monotonic()
        faults0 = minor_faults(pid)
        window_end = started_at + duration_s - min(0.3, duration_s * 0.15)
        time.sleep(max(0.0, window_end - time.monotonic()))
        served1, cpu1, t1 = served(), process_cpu_seconds(pid), time.monotonic()
        faults1 = minor_faults(pid)
        out, err = wrk.communicate(timeout=duration_s + 60)
    finally:
        if wrk.poll() is None:
            wrk.kill()
            wrk.wait()
    settle([pid])
    whole = process_cpu_seconds(pid) - whole_start
    line = next((ln for ln in out.decode().splitlines() if ln.startswith("WRK_RESULT")), None)
    if wrk.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({wrk.returncode}): {err.decode()}{out.decode()}")
    n, dur_us, connect, read, write, status, timeout = map(int, line.split()[1:8])
    p50_us, p99_us = map(float, line.split()[8:10])
    window = served1 - served0
    return Run(
        requests=n,
        rps=n / (dur_us / 1e6),
        p50_ms=p50_us / 1000,
        p99_ms=p99_us / 1000,
        errors=connect + read + write + timeout,
        non_2xx=status,
        cpu_us=(cpu1 - cpu0) / window * 1e6 if window > 0 else float("nan"),
        cpu_us_whole=whole / n * 1e6 if n else float("nan"),
        window_requests=window,
        window_rps=window / (t1 - t0),
        peak_rss_mb=memory_mb(pid, "VmHWM"),
        faults=(faults1 - faults0) / window if window > 0 else float("nan"),
    )
