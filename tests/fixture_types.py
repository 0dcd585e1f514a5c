"""The types of the fixtures in tests/conftest.py, for annotating the tests that take them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from openai import AsyncOpenAI

# `start_proxy`: starts a proxy in front of an upstream URL, returns the proxy's base URL.
ProxyFactory = Callable[..., Awaitable[str]]
# `client_for`: the official openai SDK pointed at a base URL.
Clients = Callable[[str], AsyncOpenAI]
