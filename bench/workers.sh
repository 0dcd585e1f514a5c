#!/usr/bin/env bash
# requests/s of replay-proxy with 1 and with 2 workers on this machine, interleaved, small body.
# `bash bench/workers.sh [ROUNDS]` — needs wrk and redis-server; only 127.0.0.1; stops what it
# started. Both runs use the Redis ledger: more than one worker refuses the per-process one.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
work=$(mktemp -d)
cat > "$work/small.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"bench-model","input":[{"role":"user","content":"What were the EMEA sales last week?"}],"tools":[]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench"
LUA
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
  >/dev/null 2>&1 &
redis=$!
printf 'audit: {path: %s/audit.jsonl}\nledger: {backend: redis, url: "redis://127.0.0.1:%s/0"}\n' \
  "$work" "$redis_port" > "$work/proxy.yaml"
upstream_port=$(free_port)
python3 bench/stub_upstream.py --port "$upstream_port" >/dev/null 2>&1 &
stub=$!
trap 'kill "$stub" "$redis" 2>/dev/null || true' EXIT
sleep 1
echo "| round | workers | requests/s | p50 latency |"
echo "| ---: | ---: | ---: | ---: |"
for round in $(seq "$rounds"); do
  for workers in 1 2; do
    port=$(free_port)
    python3 -m proxy serve --config "$work/proxy.yaml" --upstream "http://127.0.0.1:$upstream_port" \
      --port "$port" --workers "$workers" --log-level WARNING 2>/dev/null &
    proxy=$!
    sleep 2.5
    wrk -t2 -c64 -d2s -s "$work/small.lua" "http://127.0.0.1:$port/v1/responses" >/dev/null
    out=$(wrk -t2 -c64 -d5s --latency -s "$work/small.lua" "http://127.0.0.1:$port/v1/responses")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
    echo "| $round | $workers | $rps | $p50 |"
    kill -TERM "$proxy"
    wait "$proxy" 2>/dev/null || true
  done
done
