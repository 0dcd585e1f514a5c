"""What outlives a request: the ledger and its stores, the audit log, the metrics."""
