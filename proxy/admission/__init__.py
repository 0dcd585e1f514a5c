"""The transport-free admission pipeline every front calls."""
