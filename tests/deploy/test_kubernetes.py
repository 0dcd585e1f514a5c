"""deploy/kubernetes/: every overlay, rendered by the real `kubectl kustomize` (with and without
the ServiceMonitor component), is valid against the Kubernetes API's schemas, mounts a config
that `replay-proxy config check` and `serve`'s own reading of the environment accept with the
environment the pod would have, and wires ports, probes, keys, disruptions and traffic to it."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from proxy.config import Config
from proxy.running.cli import with_environment
from proxy.running.config_file import load_config
from tests.deploy.test_deploy import DEPLOY, STOP_MARGIN_S, dockerfile

REPO = DEPLOY.parent
KUBERNETES = DEPLOY / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())
SERVICE_MONITOR = KUBERNETES / "components" / "servicemonitor"
# The oldest Kubernetes the manifests are meant for, whose API schemas they are checked against.
KUBERNETES_VERSION = "1.30"
KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is not installed: tests/deploy renders deploy/kubernetes with "
            "`kubectl kustomize` (put kubectl 1.27 or newer on PATH)"
        )
    return found


@functools.cache
def rendered(overlay: str, *, monitored: bool = False) -> tuple[dict[str, Any], ...]:
    """The documents `kubectl kustomize` renders of an overlay (with the ServiceMonitor
    component added, as an operator's own kustomization would add it)."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = KUBERNETES / "overlays" / overlay
        if monitored:
            # Kustomize takes relative paths only.
            kustomization = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(directory, scratch)],
                "components": [os.path.relpath(SERVICE_MONITOR, scratch)],
            }
            (Path(scratch) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            directory = Path(scratch)
        done = subprocess.run(
            [kubectl(), "kustomize", str(directory)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    return tuple(yaml.safe_load_all(done.stdout))


def one(documents: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> Any:
    [found] = [
        d
        for d in documents
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


def container(documents: tuple[dict[str, Any], ...]) -> Any:
    [found] = pod(documents)["containers"]
    return found


def pod(documents: tuple[dict[str, Any], ...]) -> Any:
    return one(documents, "Deployment")["spec"]["template"]["spec"]


def pod_environment(documents: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The environment the container gets: its `envFrom` ConfigMaps, then its `env` over them;
    a Secret's key stands for itself (the Secret is the operator's)."""
    config_maps = {d["metadata"]["name"]: d["data"] for d in documents if d["kind"] == "ConfigMap"}
    found: dict[str, str] = {}
    for source in container(documents).get("envFrom", []):
        found |= config_maps[source["configMapRef"]["name"]]
    for variable in container(documents).get("env", []):
        if "value" in variable:
            found[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            found[variable["name"]] = f"from-secret-{ref['name']}-{ref['key']}"
    return found


def secret_refs(documents: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return {
        variable["name"]: variable["valueFrom"]["secretKeyRef"]
        for variable in container(documents).get("env", [])
        if "secretKeyRef" in variable.get("valueFrom", {})
    }


def mounted_config(documents: tuple[dict[str, Any], ...], directory: Path) -> Path:
    """The config file as the container reads it (`--config`), written under `directory`."""
    args = container(documents)["args"]
    path = Path(args[args.index("--config") + 1])
    [mount] = [
        m for m in container(documents)["volumeMounts"] if path.parent == Path(m["mountPath"])
    ]
    [volume] = [v for v in pod(documents)["volumes"] if v["name"] == mount["name"]]
    data = one(documents, "ConfigMap", volume["configMap"]["name"])["data"]
    written = directory / path.name
    written.write_text(data[path.name])
    return written


def served_config(documents: tuple[dict[str, Any], ...], directory: Path) -> Config:
    """The config `serve --config …` runs in the pod: the file, the REPLAY_PROXY_* variables
    over it and the keys from the environment, read by the CLI's own functions."""
    environ = pod_environment(documents)
    no_flags = argparse.Namespace(upstream=None, host=None, port=None)
    config = with_environment(load_config(mounted_config(documents, directory)), environ, no_flags)
    return config.with_secrets(environ)


def port_named(documents: tuple[dict[str, Any], ...], name: str) -> int:
    [port] = [p for p in container(documents)["ports"] if p["name"] == name]
    return int(port["containerPort"])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_overlays_are_there() -> None:
    assert {"memory", "redis"} <= set(OVERLAYS)


@pytest.mark.parametrize("monitored", [False, True], ids=["plain", "monitored"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_is_valid_against_the_kubernetes_schemas(
    overlay: str, *, monitored: bool
) -> None:
    documents = rendered(overlay, monitored=monitored)
    assert {d["kind"] for d in documents} == KINDS | ({"ServiceMonitor"} if monitored else set())
    for document in documents:
        if document["kind"] == "ServiceMonitor":
            # A custom resource (Prometheus Operator's CRD): kubernetes-validate holds only the
            # API's own kinds. test_the_servicemonitor_scrapes_the_admin_port checks it.
            continue
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_can_fail() -> None:
    deployment = one(rendered(OVERLAYS[0]), "Deployment")
    wrong = yaml.safe_load(yaml.safe_dump(deployment))
    wrong["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pth"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_mounted_config_passes_config_check(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay)
    path = mounted_config(documents, tmp_path)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REPLAY_PROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=environ | pod_environment(documents),
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: ok\n", "")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_serves_on_its_ports_with_its_keys(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay)
    config = served_config(documents, tmp_path)
    environ = pod_environment(documents)
    # The data listener from the variables, beside the container's ports; the admin one from
    # the file; both beyond the pod.
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", port_named(documents, "http"))
    assert config.admin.listen is not None
    assert config.admin.listen.host == "0.0.0.0"
    assert config.admin.listen.port == port_named(documents, "admin")
    assert config.upstream.url == environ["REPLAY_PROXY_UPSTREAM_URL"]
    # Every upstream key comes from a Secret, and the config reads it.
    named = {name: u.api_key_env for name, u in config.upstream_named.items() if u.api_key_env}
    assert named
    assert set(named.values()) <= set(secret_refs(documents))
    for upstream in config.upstream_named.values():
        assert upstream.api_key == environ[upstream.api_key_env or ""]
    assert config.log.format == "json"
    assert config.audit.path == "-"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_several_replicas_share_a_redis_ledger(overlay: str, tmp_path: Path) -> None:
    """A follow-up turn must find the first turn's record on whichever replica it reaches."""
    documents = rendered(overlay)
    replicas = one(documents, "Deployment")["spec"]["replicas"]
    config = served_config(documents, tmp_path)
    assert replicas == 1 or config.ledger.backend == "redis"
    if overlay == "memory":
        assert (replicas, config.ledger.backend) == (1, "memory")
    if overlay == "redis":
        assert replicas > 1
        assert config.ledger.backend == "redis"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_on_the_admin_port_and_graceful_termination(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay)
    config = served_config(documents, tmp_path)
    proxy = container(documents)
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "admin"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "admin"}
    pre_stop = proxy["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    needed = int(pre_stop[1]) + config.listen.shutdown_grace_s + STOP_MARGIN_S
    assert pod(documents)["terminationGracePeriodSeconds"] > needed
    security = pod(documents)["securityContext"]
    assert security["runAsNonRoot"] is True
    users = [rest for name, rest in dockerfile() if name == "USER"]
    assert str(security["runAsUser"]) == users[-1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_disruption_budget_and_network_policy(overlay: str, tmp_path: Path) -> None:
    documents = rendered(overlay)
    labels = one(documents, "Deployment")["spec"]["template"]["metadata"]["labels"]
    data = one(documents, "Service", "replay-proxy")["spec"]
    admin = one(documents, "Service", "replay-proxy-admin")["spec"]
    assert [p["targetPort"] for p in data["ports"]] == ["http"]
    assert [p["targetPort"] for p in admin["ports"]] == ["admin"]
    assert matches(data["selector"], labels)
    assert matches(admin["selector"], labels)

    budget = one(documents, "PodDisruptionBudget")["spec"]
    assert matches(budget["selector"]["matchLabels"], labels)
    assert budget["maxUnavailable"] == 1

    policy = one(documents, "NetworkPolicy")["spec"]
    assert matches(policy["podSelector"]["matchLabels"], labels)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    open_to = {p["port"] for rule in policy["ingress"] if "from" not in rule for p in rule["ports"]}
    assert open_to == {"http"}  # the admin port is not open to every pod
    assert any("admin" in {p["port"] for p in rule["ports"]} for rule in policy["ingress"])
    egress = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
    config = served_config(documents, tmp_path)
    needed = {(53, "UDP"), (port_of(config.upstream.url), "TCP")}
    if config.ledger.backend == "redis":
        needed.add((port_of(config.ledger.url), "TCP"))
    assert needed <= egress


def port_of(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or {"http": 80, "https": 443, "redis": 6379}[parts.scheme]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_servicemonitor_scrapes_the_admin_port(overlay: str) -> None:
    documents = rendered(overlay, monitored=True)
    monitor = one(documents, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    admin = one(documents, "Service", "replay-proxy-admin")
    data = one(documents, "Service", "replay-proxy")
    assert matches(selector, admin["metadata"]["labels"])
    assert not matches(selector, data["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in admin["spec"]["ports"]}
    assert endpoint["path"] == "/-/metrics"
    # The rest is the overlay as it renders without the component.
    assert [d for d in documents if d["kind"] != "ServiceMonitor"] == list(rendered(overlay))


def test_the_image_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for overlay in OVERLAYS:
        assert container(rendered(overlay))["image"] == f"replay-proxy:{version}"
