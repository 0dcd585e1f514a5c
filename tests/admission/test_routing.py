"""Route selection, pure: (path, headers, body) in, the route (upstream, model) out, first match
wins; and the prefix a path is mounted under."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.admission.routing import RouteCaches, mount, select
from proxy.config import Route
from proxy.gate.errors import ProxyError
from proxy.running.config_file import parse_config
from tests.running.test_routes_config import TWO_PROVIDERS

ROUTES = parse_config(TWO_PROVIDERS).routing

# (path, headers, body, the upstream, the index of the route, the model as it goes upstream)
SELECTIONS = [
    pytest.param("/v1/responses", {}, {"model": "gpt-5"}, "openai", 3, None, id="default"),
    pytest.param("/acme/v1/responses", {}, {"model": "gpt-5"}, "acme", 0, None, id="prefix"),
    pytest.param("/ACME/v1/responses", {}, {}, "acme", 0, None, id="prefix-case-folded"),
    pytest.param("/acme", {}, None, "acme", 0, None, id="prefix-alone"),
    pytest.param("/acmeco/v1/responses", {}, {}, "openai", 3, None, id="prefix-whole-segments"),
    pytest.param("/v1/acme/responses", {}, {}, "openai", 3, None, id="prefix-at-the-start"),
    pytest.param("/v1/responses", {}, {"model": "acme/big"}, "acme", 1, "big", id="model-glob"),
    pytest.param(
        "/v1/responses", {}, {"model": "acme/a/b"}, "acme", 1, "a/b", id="model-first-slash"
    ),
    pytest.param("/v1/responses", {}, {"model": "ACME/big"}, "openai", 3, None, id="model-case"),
    pytest.param("/v1/responses", {}, {"model": "acme"}, "openai", 3, None, id="model-no-slash"),
    pytest.param("/v1/responses", {}, {"model": ["acme/x"]}, "openai", 3, None, id="model-list"),
    pytest.param("/v1/responses", {}, None, "openai", 3, None, id="no-body-no-model-route"),
    pytest.param("/v1/responses", {"x-replay-upstream": "acme"}, {}, "acme", 2, None, id="header"),
    pytest.param(
        "/v1/responses", {"x-replay-upstream": " acme "}, {}, "acme", 2, None, id="header-trimmed"
    ),
    pytest.param(
        "/v1/responses", {"x-replay-upstream": "Acme"}, {}, "openai", 3, None, id="header-exact"
    ),
    pytest.param(
        "/v1/responses", {"x-other": "acme"}, {}, "openai", 3, None, id="header-other-name"
    ),
    pytest.param(
        "/acme/v1/responses",
        {"x-replay-upstream": "acme"},
        {"model": "acme/big"},
        "acme",
        0,
        None,
        id="first-match-wins",
    ),
]


@pytest.mark.parametrize(("path", "headers", "body", "upstream", "index", "model"), SELECTIONS)
def test_select(
    path: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    upstream: str,
    index: int,
    model: str | None,
) -> None:
    routed = select(ROUTES, path, headers, body)
    assert (routed.upstream, routed.route, routed.model) == (upstream, ROUTES[index], model)
    assert routed.policy is ROUTES[index].gate


def test_every_matcher_of_a_route_must_match() -> None:
    both = Route("acme", path_prefix="/acme", model="big-*")
    routes = (both, Route("openai"))
    assert select(routes, "/acme/v1/responses", {}, {"model": "big-1"}).route is both
    assert select(routes, "/acme/v1/responses", {}, {"model": "small"}).upstream == "openai"
    assert select(routes, "/v1/responses", {}, {"model": "big-1"}).upstream == "openai"


def test_no_route_is_a_400_naming_what_was_matched() -> None:
    with pytest.raises(ProxyError) as caught:
        select((Route("acme", model="acme/*"),), "/v1/responses", {}, {"model": "gpt-5"})
    assert (caught.value.status, caught.value.code) == (400, "no_route")
    assert "'/v1/responses'" in caught.value.message
    assert "'gpt-5'" in caught.value.message


# (path, the prefix it is under, the rest)
MOUNTS = [
    pytest.param("/acme/v1/responses", "/acme", "/v1/responses", id="under"),
    pytest.param("/Acme/v1/responses", "/Acme", "/v1/responses", id="case-folded"),
    pytest.param("/acme", "/acme", "/", id="the-prefix"),
    pytest.param("/acme/", "/acme", "/", id="trailing-slash"),
    pytest.param("/acmex/v1/responses", "", "/acmex/v1/responses", id="not-a-segment"),
    pytest.param("/v1/responses", "", "/v1/responses", id="none"),
]


@pytest.mark.parametrize(("path", "prefix", "rest"), MOUNTS)
def test_mount(path: str, prefix: str, rest: str) -> None:
    assert mount(ROUTES, path) == (prefix, rest)


def test_routes_that_share_a_policy_share_its_caches() -> None:
    config = parse_config(TWO_PROVIDERS)
    caches = RouteCaches(config)
    acme = [caches.of(route.gate) for route in config.routing[:3]]
    assert acme[0] is acme[1] is acme[2]
    assert caches.of(config.routing[3].gate) is not acme[0]
    assert caches.of(config.gate) is caches.default
