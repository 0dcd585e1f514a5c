"""replay-proxy: a reverse proxy that gates replayed tool outputs for the Open Responses API."""
