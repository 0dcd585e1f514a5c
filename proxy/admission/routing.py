"""Routes: which upstream a request goes to, under which path, with which policy; pure.

Every front calls the same two functions: `mounted` with the request's target, before the body
is read (a path under a route's `path_prefix` is read, gated and forwarded without it), and
`select` with what the request says (its path, headers and, once read, its body). The first
route whose matchers all match wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from proxy.admission import targets
from proxy.admission.prefixes import Prefixes
from proxy.config import Config, Route
from proxy.gate.caches import GateCaches
from proxy.gate.errors import ProxyError
from proxy.gate.policy import Policy
from proxy.gate.values import value
from proxy.gate.verdict import Bounds


@value
class Routed:
    """The route a request takes: its upstream, and the body's `model` as it goes upstream
    (None: unchanged)."""

    route: Route
    model: str | None = None

    @property
    def upstream(self) -> str:
        return self.route.upstream

    @property
    def policy(self) -> Policy:
        return self.route.gate


def route_headers(
    routes: Sequence[Route], values: Callable[[str], Sequence[str]]
) -> dict[str, str]:
    """The headers routes match on, by lower-case name, from `values` (a header's values, none
    when absent; several are joined, as RFC 9110 §5.3 reads them): what every front gives
    `select`."""
    return {
        name: ", ".join(given)
        for route in routes
        if route.header is not None
        if (given := values(name := route.header[0]))
    }


def mount(routes: Sequence[Route], path: str) -> tuple[str, str]:
    """(the `path_prefix` of the first route `path` is under, the path without it); ("", path)
    when it is under none. The prefix is matched whole segments at a time, case folded."""
    folded = path.casefold()
    for route in routes:
        prefix = route.path_prefix
        if prefix is None:
            continue
        folded_prefix = prefix.casefold()
        if folded == folded_prefix or folded.startswith(folded_prefix + "/"):
            return path[: len(prefix)], path[len(prefix) :] or "/"
    return "", path


def mounted(routes: Sequence[Route], target: targets.Target) -> targets.Target:
    """The request `target` stands for under the `path_prefix` of the first route its path is
    under: the rest of the path read again as a target, to be gated and forwarded without the
    prefix; `target` itself when it is under none. TargetError when the rest does not read as
    one target (the path as received is what routes still match: `target.path`)."""
    prefix, rest = mount(routes, target.path)
    return targets.read_target(rest + target.query) if prefix else target


def select(
    routes: Sequence[Route],
    path: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
) -> Routed:
    """The first route that matches: `path` as received (normalised, prefix and all), `headers`
    by lower-case name, and `body` parsed (None: no body, so no model route matches).

    Raises ProxyError (400 `no_route`) when none does.
    """
    model = body.get("model") if body is not None else None
    for route in routes:
        if route.path_prefix is not None and mount((route,), path)[0] == "":
            continue
        if route.header is not None:
            name, value = route.header
            if headers.get(name, "").strip() != value:
                continue
        if route.model is not None:
            if not isinstance(model, str) or not fnmatchcase(model, route.model):
                continue
            if route.strip_model_prefix and "/" in model:
                return Routed(route, model.partition("/")[2])
        return Routed(route)
    said = f" and model {model!r}" if isinstance(model, str) else ""
    raise ProxyError(
        400, "no_route", f"no route of the config takes path {path!r}{said}", param="model"
    )


def bounds_of(config: Config) -> Bounds:
    """What a verdict may list under this config (`limits`), at admission and at door 2."""
    limits = config.limits
    return Bounds(limits.max_findings, limits.max_violations, limits.max_body_bytes)


class RouteCaches:
    """What the gate learns under each route's policy: one `GateCaches` per distinct policy, the
    top-level `gate:`'s shared by every route that does not override it; and what a verdict may
    list under the config (`bounds`)."""

    def __init__(self, config: Config) -> None:
        self.bounds = bounds_of(config)
        # Whether any route matches on a header: when none does, a request's headers are not
        # read for its route (once per config, not on every request).
        self.match_headers = any(route.header is not None for route in config.routing)
        self.default = GateCaches.for_policy(config.gate)
        # The bodies of live sessions passed clean under this config (its gate and routes).
        limits = config.limits
        self.prefixes = Prefixes(limits.max_prefix_bytes, limits.max_prefix_sessions)
        self._policies: list[tuple[Policy, GateCaches]] = [(config.gate, self.default)]
        for route in (*config.routing, *config.mcp_routes.values()):
            if not any(route.gate == policy for policy, _ in self._policies):
                self._policies.append((route.gate, GateCaches.for_policy(route.gate)))

    def of(self, policy: Policy) -> GateCaches:
        for known, caches in self._policies:
            if known is policy:
                return caches
        for known, caches in self._policies:
            if known == policy:
                return caches
        return GateCaches.for_policy(policy)

    def __len__(self) -> int:
        """The verdicts remembered under every policy."""
        return sum(len(caches.verdicts) for _, caches in self._policies)
