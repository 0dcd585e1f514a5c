#!/usr/bin/env bash
# Regenerates the lock (constraints) files from the version ranges the project declares:
#   requirements/test.txt     everything `pip install -e '.[test]'` brings (tests, bench/, lint)
#   requirements/litellm.txt  the separate virtualenv bench/ runs LiteLLM's proxy from
# Run from anywhere: bash requirements/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install --quiet --disable-pip-version-check 'uv==0.13.8'
compile() { "$tools/bin/uv" pip compile --quiet --python-version 3.11 --no-header "$@"; }
compile pyproject.toml --all-extras -o requirements/test.txt
litellm=$(sed -n 's/^VERSION = "\(.*\)"$/\1/p' bench/litellm_target.py)
echo "litellm[proxy]==$litellm" | compile - -o requirements/litellm.txt
