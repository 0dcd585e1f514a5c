"""The fronts: HTTP and WebSocket on aiohttp, and the upstream hop."""
