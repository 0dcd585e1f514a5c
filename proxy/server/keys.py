"""The typed keys of the app's state and of a request's."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from proxy.admission.exchange import Exchange
from proxy.admission.services import Services
from proxy.server.in_force import InForceHolder
from proxy.server.readiness import Readiness
from proxy.state.metrics import Metrics
from proxy.state.workers import WorkerSlot

IN_FORCE = web.AppKey("in_force", InForceHolder)

METRICS = web.AppKey("metrics", Metrics)

# The audit log, the ledger and door 2's checks (with the metrics): opened once, at start.
SERVICES = web.AppKey("services", Services)

# The request's exchange, once its target was read.
EXCHANGE = web.RequestKey("exchange", Exchange)

# The proxy's own id of a request (`proxy.admission.ids.new_request_id`).
REQUEST_ID = web.RequestKey("request_id", str)


READINESS = web.AppKey("readiness", Readiness)

# The tasks of the requests being handled now, which a stop waits for (`serving.InFlight`).
IN_FLIGHT: web.AppKey[set[asyncio.Task[Any]]] = web.AppKey("in_flight")

# The supervisor's slot this process fills, under `serve --workers N` only.
WORKER = web.AppKey("worker", WorkerSlot)
