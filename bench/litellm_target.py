"""LiteLLM's proxy as a benchmark target, run from its own virtualenv in front of the stub upstream.

LiteLLM (`litellm[proxy]`, pinned to `VERSION`) lives in `bench/.venv-litellm`, apart from the
project's environment: it pulls in some hundred packages whose pins would clash with ours.
`install_command()` makes that virtualenv; `available()` tells whether it is there.

`argv_and_config()` writes `litellm.yaml` and returns the command line and the extra environment.
The config has one deployment and as little else as LiteLLM allows:

- `model_list`: the public name `bench-model` (what the benchmark bodies ask for) maps to
  `openai/bench-model` at `<upstream>/v1`. The `openai/` provider sends a client's
  `POST /v1/responses` natively to `{api_base}/responses` (no bridge through Chat Completions),
  as JSON or, for `"stream": true`, as SSE relayed event by event. `api_key` is a placeholder:
  the OpenAI provider refuses to call without one, and the stub checks none.
- `litellm_settings`: no callbacks (no logging integrations), no retries (an upstream error is
  the answer, not three more requests), a 30 s upstream timeout.
- `general_settings`: no master key, so the benchmark's `Authorization: Bearer bench-tenant` is
  accepted as it is (LiteLLM then treats every caller as an internal user, checks no key, and
  keeps no database). Since 1.10x LiteLLM refuses to start without a master key unless
  `dangerously_permit_weak_or_unset_master_key` is on. `disable_spend_logs` and
  `disable_error_logs` say outright that nothing is written anywhere (there is no database
  anyway). LiteLLM still computes each answer's cost in process and cannot be told not to.

No database URL, Redis or Prometheus is configured, and `--num_workers 1` keeps one process
(uvicorn in the process that was started, so its PID is the one to measure).

The environment (`_ENV`): `LITELLM_LOG=ERROR` keeps per-request logging quiet, and the
`LITELLM_LOCAL_*` switches make LiteLLM use the copies bundled with the package instead of
fetching the model cost map, the Anthropic beta-header map, the blog feed, policy templates and
router presets from the internet at start-up or on first use (unreachable here: the cost map
fetch alone retries for some 20 s before it falls back). The caller's environment must not set
`LITELLM_MASTER_KEY` or `DATABASE_URL`, which would turn on key checks or a database.

What the stub sees: each body parsed and re-encoded (with `"stream"` after `"input"`, where
the stub does not look for it, so only JSON answers are compared: issue 5's LiteLLM figures
are for JSON too), and at start-up one `GET /v1/models`. LiteLLM rebuilds each answer (a new
id, many `null` fields) rather than passing it through. Start-up takes some 8 to 13 s here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

VENV = Path(__file__).parent / ".venv-litellm"
VERSION = "1.108.7"
MODEL = "bench-model"
CONFIG_NAME = "litellm.yaml"

_ENV: dict[str, str] = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
}


def _executable() -> Path:
    return VENV / "bin" / "litellm"


def available() -> bool:
    """Whether the virtualenv with LiteLLM's proxy is installed."""
    return _executable().is_file()


def install_command() -> str:
    """The shell command, run from the repository root, that creates the virtualenv and
    installs the pinned LiteLLM into it, with the versions of requirements/litellm.txt."""
    venv = "bench/.venv-litellm"
    return (
        f"python3.11 -m venv {venv} && {venv}/bin/pip install "
        f"-c requirements/litellm.txt 'litellm[proxy]=={VERSION}'"
    )


def config(upstream_url: str) -> dict[str, Any]:
    """The proxy config: `bench-model` forwarded to the OpenAI-compatible `upstream_url`."""
    base = upstream_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": base,
                    "api_key": "bench-upstream",
                },
            }
        ],
        "litellm_settings": {"callbacks": [], "num_retries": 0, "request_timeout": 30},
        "general_settings": {
            "dangerously_permit_weak_or_unset_master_key": True,
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
    }


def argv_and_config(
    upstream_url: str, port: int, directory: Path
) -> tuple[list[str], dict[str, str]]:
    """Write the config into `directory`; the argv serving it on 127.0.0.1:`port`, and its env.

    `upstream_url` is the stub's base URL, with or without the trailing `/v1`.
    """
    path = directory / CONFIG_NAME
    path.write_text(yaml.safe_dump(config(upstream_url), sort_keys=False), encoding="utf-8")
    argv = [
        str(_executable()),
        "--config",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    return argv, dict(_ENV)
