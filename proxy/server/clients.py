"""Who a client is: its tenant, from its credential and the listed clients."""

from __future__ import annotations

from multidict import CIMultiDictProxy

from proxy.admission.tenants import credential_of, tenant_for
from proxy.config import Config


def tenant_of(headers: CIMultiDictProxy[str], config: Config) -> str | None:
    """The tenant a request acts for: the name of its client when the config lists clients
    (a ProxyError 401 without a listed key), else a fingerprint of its credential."""
    return tenant_for(credential_of(lambda name: headers.getall(name, ())), config)
