"""Run a module on uvloop's event loop: `python bench/on_uvloop.py -m proxy serve ...`.

Whatever the module starts with `asyncio.run` runs on uvloop; the benchmark measures
replay-proxy on both loops this way, without a switch in the proxy itself.
"""

from __future__ import annotations

import asyncio
import runpy
import sys

import uvloop


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: python bench/on_uvloop.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
