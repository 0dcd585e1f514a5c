"""The processor's own work per request, without gRPC: the four ext_proc messages of one
request (headers, body, answer headers, answer body) answered by `proxy.extproc.exchange`
in-process, the admission pipeline and the ledger included.

`python bench/extproc_cost.py` prints µs of CPU per request for the Envoy benchmark's bodies;
`bench/envoy_load.py` adds the same figures (`bench/processor.py`) to its section.
"""

from __future__ import annotations

import sys

from processor import costs


def main() -> int:
    for name, us in costs(("small", "10 pairs")).items():
        sys.stdout.write(f"{name}: {us:.0f} µs per request\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
