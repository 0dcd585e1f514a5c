"""Who a client is: its tenant, from the credential it presents and the listed clients."""

from __future__ import annotations

import hashlib
import hmac

from proxy.admission.credentials import CREDENTIAL_HEADERS as CREDENTIAL_HEADERS
from proxy.admission.credentials import credential_of as credential_of
from proxy.config import Config
from proxy.gate.errors import ProxyError
from proxy.state import audit

# The ledger's key for a request that acts for no tenant (no credential, no clients listed).
NO_TENANT = "-"


def ledger_key(tenant: str | None) -> str:
    """What the ledger keeps a tenant's responses under."""
    return tenant or NO_TENANT


def tenant_for(credential: str | None, config: Config) -> str | None:
    """The tenant a request acts for, from its `Authorization` (or `api-key`) value: the name
    of its client when the config lists clients (a ProxyError 401 without a listed key), else a
    fingerprint of its credential."""
    if not config.clients:
        return audit.tenant_of(credential)
    key = credential or ""
    if key[:7].lower() == "bearer ":
        key = key[7:].strip()
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    found = None
    for client in config.clients:
        # Every entry is compared, in constant time, whatever matches.
        if hmac.compare_digest(digest, client.key_sha256) and key:
            found = client.name
    if found is None:
        raise ProxyError(
            401,
            "invalid_api_key",
            "a valid API key for this proxy is required",
            headers={"WWW-Authenticate": "Bearer"},
            type="authentication_error",
        )
    return found
