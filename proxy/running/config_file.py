"""The YAML config file: its schema, and loading it into a Config naming every mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from proxy.config import Config
from proxy.gate.policy import ACTIONS, ALL_REASONS, Policy
from proxy.settings import Audit, Client, ConfigError, Ledger, Limits, Listen, Upstream


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


_SECONDS = {"type": "number", "exclusiveMinimum": 0}

_ACTION = {"enum": list(ACTIONS)}

# The shape of the file; values are checked further where the dataclasses are built.
CONFIG_SCHEMA: dict[str, Any] = _object(
    {
        "listen": _object(
            {
                "host": {"type": "string", "minLength": 1},
                "port": {"type": "integer", "minimum": 0, "maximum": 65535},
                "shutdown_grace_s": {"type": "number", "minimum": 0},
                "header_timeout_s": _SECONDS,
            }
        ),
        "upstream": _object(
            {
                "url": {"type": "string", "minLength": 1},
                "connect_timeout_s": _SECONDS,
                "read_timeout_s": _SECONDS,
                "api_key_env": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                "max_connections": {"type": "integer", "minimum": 1},
                "keepalive_s": _SECONDS,
                "ca_file": {"type": "string", "minLength": 1},
                "client_cert": {"type": "string", "minLength": 1},
                "client_key": {"type": "string", "minLength": 1},
                "trust_env": {"type": "boolean"},
            }
        ),
        "gate": _object(
            {
                "action": _ACTION,
                "actions": {
                    "type": "object",
                    "propertyNames": {"enum": list(ALL_REASONS)},
                    "additionalProperties": _ACTION,
                },
                "allow_missing_status": {"type": "boolean"},
                "require_provenance": {"type": "boolean"},
                "max_cached_verdicts": {"type": "integer", "minimum": 1},
                "validation_timeout_s": _SECONDS,
                "schema_limits": _object(
                    {
                        name: {"type": "integer", "minimum": 1}
                        for name in (
                            "max_bytes",
                            "max_depth",
                            "max_subschemas",
                            "max_pattern_length",
                        )
                    }
                ),
            }
        ),
        "tools": {"type": "object", "additionalProperties": {"type": ["object", "boolean"]}},
        "clients": {
            "type": "array",
            "items": {
                **_object(
                    {
                        "name": {"type": "string", "minLength": 1},
                        "key_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    }
                ),
                "required": ["name", "key_sha256"],
            },
        },
        "audit": _object(
            {
                "path": {"type": "string", "minLength": 1},
                "include_arguments": {"type": "boolean"},
                "max_bytes": {"type": ["integer", "null"], "minimum": 1},
            }
        ),
        "ledger": _object(
            {
                "backend": {"enum": ["memory", "redis"]},
                "url": {"type": "string", "pattern": "^(redis|rediss|unix)://"},
                "ttl_s": _SECONDS,
                "max_responses": {"type": "integer", "minimum": 1},
                "max_chain": {"type": "integer", "minimum": 1},
                "timeout_s": _SECONDS,
                "fail_open": {"type": "boolean"},
            }
        ),
        "limits": _object(
            {
                "max_body_bytes": {"type": "integer", "minimum": 1},
                "body_timeout_s": _SECONDS,
            }
        ),
    }
)

_CONFIG_VALIDATOR = jsonschema.Draft202012Validator(CONFIG_SCHEMA)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice is an error instead of the last one winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_config({} if data is None else data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_config(data: Any) -> Config:
    """Build a Config from parsed YAML; an unknown key or a bad value raises ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError("the config must be a mapping of sections")
    errors = sorted(_CONFIG_VALIDATOR.iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        raise ConfigError(_explain(errors[0]))
    sections: dict[str, Any] = {}
    for name, cls in (
        ("listen", Listen),
        ("upstream", Upstream),
        ("audit", Audit),
        ("ledger", Ledger),
        ("limits", Limits),
    ):
        try:
            sections[name] = cls(**data.get(name, {}))
        except ValueError as exc:
            raise ConfigError(f"{name}.{exc}") from None
    clients = tuple(Client(**c) for c in data.get("clients", ()))
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ConfigError("clients: two clients have the same name")
    if len({c.key_sha256 for c in clients}) != len(clients):
        raise ConfigError("clients: two clients have the same key")
    try:
        policy = Policy(**data.get("gate", {}), tools=data.get("tools", {}))
    except ValueError as exc:
        key = str(exc)
        raise ConfigError(key if key.startswith("tools.") else f"gate.{key}") from None
    return Config(gate=policy, clients=clients, **sections)


def _explain(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        # key=str: YAML keys need not be strings, and 1 < "a" would raise.
        unknown = sorted((k for k in error.instance if k not in known), key=str)
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        return f"{key}: unknown key"
    # A propertyNames failure reports the inner keyword (`enum`) with the property as instance.
    if "propertyNames" in error.relative_schema_path:
        return f"{where}.{error.instance}: unknown reason"
    return f"{where or 'config'}: {error.message}"
