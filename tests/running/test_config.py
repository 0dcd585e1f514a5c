"""The YAML config: defaults, every key, and a ConfigError naming the key for every mistake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import Config
from proxy.gate.policy import Policy
from proxy.gate.verdict import inspect
from proxy.running.config_file import load_config, parse_config
from proxy.settings import Audit, ConfigError, LedgerSettings, Limits, Listen, UpstreamSettings
from tests.builders import SALES_SCHEMA as SALES

ROOT = Path(__file__).resolve().parents[2]


EVERY_KEY = """\
listen:
  host: 0.0.0.0
  port: 9000
  shutdown_grace_s: 5
upstream:
  url: https://api.example.test/base
  connect_timeout_s: 2.5
  read_timeout_s: 30
gate:
  action: strip
  actions: {namespaced: log, envelope: block}
  allow_missing_status: true
  require_provenance: true
  max_cached_verdicts: 10
tools:
  get_latest_sales_report:
    type: object
    additionalProperties: false
    required: [region]
    properties:
      region: {type: string, enum: [apac, emea, amer]}
  anything: true
audit:
  path: /var/log/replay-proxy.jsonl
  include_arguments: true
ledger:
  backend: redis
  url: rediss://cache.example.test:6380/2
  ttl_s: 60
  max_responses: 5
  max_chain: 3
  timeout_s: 0.5
  fail_open: true
limits:
  max_body_bytes: 1024
  max_findings: 7
  max_violations: 3
"""


def test_every_key(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(EVERY_KEY, encoding="utf-8")
    config = load_config(path)
    assert config.listen == Listen(host="0.0.0.0", port=9000, shutdown_grace_s=5)
    assert config.upstream == UpstreamSettings(
        url="https://api.example.test/base", connect_timeout_s=2.5, read_timeout_s=30
    )
    assert config.gate == Policy(
        action="strip",
        actions={"namespaced": "log", "envelope": "block"},
        allow_missing_status=True,
        require_provenance=True,
        max_cached_verdicts=10,
        tools={"get_latest_sales_report": SALES, "anything": True},
    )
    assert config.audit == Audit(path="/var/log/replay-proxy.jsonl", include_arguments=True)
    assert config.ledger == LedgerSettings(
        backend="redis",
        url="rediss://cache.example.test:6380/2",
        ttl_s=60,
        max_responses=5,
        max_chain=3,
        timeout_s=0.5,
        fail_open=True,
    )
    assert config.limits == Limits(max_body_bytes=1024, max_findings=7, max_violations=3)


def test_pinned_tools_are_compiled_and_used(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(EVERY_KEY.replace("require_provenance: true", ""), encoding="utf-8")
    policy = load_config(path).gate
    call = {
        "type": "function_call",
        "call_id": "c",
        "name": "get_latest_sales_report",
        "status": "completed",
        "arguments": '{"region":"global"}',
    }
    output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    # The request's own tool would accept anything: the pinned schema wins.
    loose = [{"type": "function", "name": "get_latest_sales_report", "parameters": {}}]
    verdict = inspect({"input": [call, output], "tools": loose}, policy)
    assert [f.as_dict()["fail"] for f in verdict.findings] == [
        [{"path": "/region", "reason": "enum", "expected": ["apac", "emea", "amer"]}]
    ]
    assert verdict.outcome == "strip"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty-file"),
        pytest.param("# only a comment\n", id="only-comments"),
        pytest.param("{}\n", id="empty-mapping"),
        pytest.param("listen: {}\ngate: {}\ntools: {}\n", id="empty-sections"),
    ],
)
def test_defaults(tmp_path: Path, text: str) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(text, encoding="utf-8")
    config = load_config(path)
    assert config == Config()
    assert config.listen == Listen(host="127.0.0.1", port=8787)
    assert config.upstream.url == "http://127.0.0.1:8000"
    assert config.gate == Policy(action="block", actions={}, allow_missing_status=False)
    assert config.gate.require_provenance is False
    assert config.gate.pinned == {}
    assert config.audit == Audit(path="-", include_arguments=False)
    assert config.ledger.backend == "memory"


@pytest.mark.parametrize("reason", ["unknown_reference", "ambiguous_item", "envelope"])
def test_item_level_reasons_take_their_own_action(reason: str) -> None:
    config = parse_config({"gate": {"action": "block", "actions": {reason: "strip"}}})
    assert config.gate.action_for(reason) == "strip"
    assert config.gate.action_for("orphan") == "block"
    assert parse_config({"gate": {"action": "log"}}).gate.action_for(reason) == "log"


def test_rewrite_by_default_blocks_what_it_cannot_rewrite() -> None:
    config = parse_config({"gate": {"action": "rewrite", "actions": {"status": "log"}}})
    assert [config.gate.action_for(r) for r in ("arguments_schema", "status", "orphan")] == [
        "rewrite",
        "log",
        "block",
    ]


def test_example_config_shows_the_defaults() -> None:
    config = load_config(ROOT / "config.example.yaml")
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    defaults = Config()
    assert config.listen == defaults.listen
    assert config.upstream == defaults.upstream
    assert config.audit == defaults.audit
    assert config.limits == defaults.limits
    # The gate's values are the defaults; its pinned tool is the documented example.
    assert config.gate == Policy(tools=example["tools"])


# (config, the key the error must start with)
MISTAKES = [
    # unknown or misspelled keys, anywhere
    pytest.param({"gat": {}}, "gat: unknown key", id="top-level"),
    pytest.param({"gate": {"actons": {}}}, "gate.actons: unknown key", id="gate.actons"),
    pytest.param({"listen": {"hots": "x"}}, "listen.hots: unknown key", id="listen.hots"),
    pytest.param({"upstream": {"uri": "http://x"}}, "upstream.uri: unknown key", id="upstream"),
    pytest.param({"audit": {"paht": "-"}}, "audit.paht: unknown key", id="audit.paht"),
    pytest.param({"ledger": {"backnd": "redis"}}, "ledger.backnd: unknown key", id="ledger"),
    pytest.param({"limits": {"max_body": 1}}, "limits.max_body: unknown key", id="limits"),
    pytest.param(
        {"gate": {"actions": {"orphn": "block"}}},
        "gate.actions.orphn: unknown reason",
        id="gate.actions.orphn",
    ),
    pytest.param({"gate": {"zz": 1, 7: 2}}, "gate.7: unknown key", id="non-string-key"),
    # bad values
    pytest.param({"gate": {"action": "allow"}}, "gate.action: 'allow' is not one of", id="action"),
    pytest.param({"gate": {"action": False}}, "gate.action: False is not one of", id="yaml-no"),
    pytest.param(
        {"gate": {"actions": {"orphan": "allow"}}},
        "gate.actions.orphan: 'allow' is not one of",
        id="actions.orphan",
    ),
    pytest.param({"gate": {"actions": []}}, "gate.actions: [] is not of type", id="actions-list"),
    *(
        pytest.param(
            {"gate": {"actions": {reason: "rewrite"}}},
            f"gate.actions.{reason}: rewrite is not an action for {reason}",
            id=f"rewrite-{reason}",
        )
        for reason in (
            "envelope",
            "orphan",
            "duplicate_call_id",
            "unknown_reference",
            "ambiguous_item",
        )
    ),
    pytest.param(
        {"gate": {"allow_missing_status": "yes"}},
        "gate.allow_missing_status: 'yes' is not of type 'boolean'",
        id="allow-missing-status",
    ),
    pytest.param(
        {"gate": {"max_cached_verdicts": 0}}, "gate.max_cached_verdicts: 0 is less", id="cache-0"
    ),
    pytest.param({"listen": {"port": 70000}}, "listen.port: 70000 is greater", id="port-high"),
    pytest.param({"listen": {"port": -1}}, "listen.port: -1 is less", id="port-negative"),
    pytest.param({"listen": {"port": "8787"}}, "listen.port: '8787' is not of type", id="str"),
    pytest.param({"listen": {"port": True}}, "listen.port: True is not of type", id="port-bool"),
    pytest.param(
        {"upstream": {"url": "ftp://example.test"}},
        "upstream.url: 'ftp://example.test' is not an http(s) URL with a host",
        id="url-ftp",
    ),
    pytest.param(
        {"upstream": {"url": "localhost:8000"}},
        "upstream.url: 'localhost:8000' is not an http(s) URL",
        id="url-no-scheme",
    ),
    pytest.param({"upstream": {"url": "http://"}}, "upstream.url: 'http://' is not", id="no-host"),
    pytest.param(
        {"upstream": {"url": "http://x/?key=1"}},
        "upstream.url: 'http://x/?key=1' may not carry a query",
        id="url-query",
    ),
    pytest.param(
        {"upstream": {"url": "https://user:s3cret@x.test/v1"}},
        "upstream.url: may not carry credentials",
        id="url-credentials",
    ),
    pytest.param(
        {"upstream": {"read_timeout_s": 0}}, "upstream.read_timeout_s: 0 is less", id="timeout-0"
    ),
    pytest.param({"audit": {"path": ""}}, "audit.path: '' should be non-empty", id="audit-path"),
    pytest.param(
        {"ledger": {"backend": "sqlite"}}, "ledger.backend: 'sqlite' is not one of", id="backend"
    ),
    pytest.param(
        {"ledger": {"url": "http://cache"}}, "ledger.url: 'http://cache' does not match", id="redis"
    ),
    pytest.param(
        {"limits": {"max_body_bytes": 0}}, "limits.max_body_bytes: 0 is less", id="max-body-0"
    ),
    pytest.param(
        {"limits": {"max_findings": 0}}, "limits.max_findings: 0 is less", id="max-findings-0"
    ),
    pytest.param(
        {"limits": {"max_violations": "20"}},
        "limits.max_violations: '20' is not of type 'integer'",
        id="max-violations-string",
    ),
    pytest.param(
        {"gate": {"schema_limits": {"max_depth": 0}}},
        "gate.schema_limits.max_depth: 0 is less",
        id="schema-limit-0",
    ),
    pytest.param(
        {"gate": {"schema_limits": {"max_dept": 8}}},
        "gate.schema_limits.max_dept: unknown key",
        id="schema-limit-misspelled",
    ),
    pytest.param(
        {"gate": {"schema_limits": {"max_bytes": "1MB"}}},
        "gate.schema_limits.max_bytes: '1MB' is not of type 'integer'",
        id="schema-limit-not-a-number",
    ),
    pytest.param(
        {"gate": {"schema_limits": {"max_subschemas": 3}}, "tools": {"t": {"anyOf": [{}, {}, {}]}}},
        "tools.t: not a valid JSON Schema: schema over schema_limits.max_subschemas",
        id="pinned-schema-over-a-limit",
    ),
    pytest.param({"gate": None}, "gate: None is not of type 'object'", id="section-null"),
    pytest.param({"listen": [8787]}, "listen: [8787] is not of type 'object'", id="section-list"),
    pytest.param([], "the config must be a mapping", id="not-a-mapping"),
    pytest.param("gate", "the config must be a mapping", id="a-string"),
    # tool schemas that are not JSON Schemas
    pytest.param(
        {"tools": {"t": {"type": 12}}}, "tools.t: not a valid JSON Schema", id="schema-type-12"
    ),
    pytest.param(
        {"tools": {"t": {"properties": {"a": {"type": "strng"}}}}},
        "tools.t: not a valid JSON Schema",
        id="schema-bad-type-name",
    ),
    pytest.param(
        {"tools": {"t": {"pattern": "("}}}, "tools.t: not a valid JSON Schema", id="bad-pattern"
    ),
    pytest.param(
        {"tools": {"t": {"$schema": 7}}}, "tools.t: not a valid JSON Schema", id="schema-not-str"
    ),
    pytest.param({"tools": {"t": 12}}, "tools.t: 12 is not of type", id="schema-a-number"),
    pytest.param({"tools": []}, "tools: [] is not of type 'object'", id="tools-list"),
]


@pytest.mark.parametrize(("data", "message"), MISTAKES)
def test_mistake_names_the_key(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value).startswith(message)


def test_upstream_credentials_are_refused_without_being_repeated() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstream": {"url": "https://user:s3cret@x.test/v1"}})
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("gate:\n  actons: {}\n", "proxy.yaml:2:3: gate.actons: unknown key", id="key"),
        pytest.param("gate: [\n", "proxy.yaml: not valid YAML", id="yaml-syntax"),
        pytest.param("- gate\n", "proxy.yaml: the config must be a mapping", id="yaml-list"),
        pytest.param(
            "tools:\n  t: {type: 12}\n",
            "proxy.yaml:2:3: tools.t: not a valid JSON Schema",
            id="tool",
        ),
    ],
)
def test_load_config_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path.parent}/{message}")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: p / "missing.yaml", id="missing"),
        pytest.param(lambda p: p, id="a-directory"),
    ],
)
def test_unreadable_config(tmp_path: Path, make: Any) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


def test_invalid_utf8_config(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_bytes(b"audit:\n  path: \xff\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({}, Config(), id="none"),
        pytest.param(
            {"upstream": "https://up.example.test", "host": "::1", "port": 0},
            Config(
                listen=Listen(host="::1", port=0),
                upstream=UpstreamSettings("https://up.example.test"),
            ),
            id="all",
        ),
    ],
)
def test_with_overrides(overrides: dict[str, Any], expected: Config) -> None:
    assert Config().with_overrides(**overrides) == expected


def test_bad_upstream_override_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--upstream: url: 'ftp://x' is not an http\(s\) URL"):
        Config().with_overrides(upstream="ftp://x")


def test_redis_backend_without_the_client_names_the_fix(tmp_path: Path) -> None:
    """With `backend: redis` and no redis-py, the CLI refuses the config in one line, exit 2,
    before any worker starts (a fresh `pip install -e .` has no redis-py)."""
    config = tmp_path / "config.yaml"
    config.write_text("upstream: {url: http://127.0.0.1:9}\nledger: {backend: redis}\n")
    hide_redis = (
        "import sys; sys.modules['redis'] = None; from proxy.running.cli import main; "
        f"sys.exit(main(['serve', '--config', {str(config)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide_redis], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"replay-proxy: {config}:2:10: ledger.backend: redis needs the redis client: "
        "pip install 'replay-proxy[redis]'\n"
    )
