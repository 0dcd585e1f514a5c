"""The typed keys of the app's state and of a request's."""

from __future__ import annotations

from aiohttp import web

from proxy.admission.emitted import EmittedChecks
from proxy.server.in_force import InForceHolder
from proxy.server.readiness import Readiness
from proxy.state.audit import AuditLog
from proxy.state.ledger import Ledger
from proxy.state.metrics import Metrics
from proxy.state.workers import WorkerSlot

IN_FORCE = web.AppKey("in_force", InForceHolder)

AUDIT = web.AppKey("audit", AuditLog)

METRICS = web.AppKey("metrics", Metrics)

LEDGER = web.AppKey("ledger", Ledger)

# Door 2: the checks of the calls upstreams emitted, run once each answer is relayed.
EMITTED = web.AppKey("emitted", EmittedChecks)

# The proxy's own id of a request (`proxy.admission.ids.new_request_id`).
REQUEST_ID = web.RequestKey("request_id", str)


READINESS = web.AppKey("readiness", Readiness)

# The supervisor's slot this process fills, under `serve --workers N` only.
WORKER = web.AppKey("worker", WorkerSlot)
