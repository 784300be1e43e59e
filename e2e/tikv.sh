#!/usr/bin/env bash
# Runs kshard's storage conformance suite and the multi-replica test against a real TiKV cluster (TiUP
# playground, PD + TiKV, no TiDB) instead of the in-process test double.
# Needs internet access (installs TiUP and downloads TiKV/PD).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v tiup >/dev/null 2>&1 || {
  curl --proto '=https' --tlsv1.2 -sSf https://tiup-mirrors.pingcap.com/install.sh | sh
  export PATH="$HOME/.tiup/bin:$PATH"
}

log=$(mktemp)
tiup playground --mode tikv-slim --without-monitor --tag kshard-e2e >"$log" 2>&1 &
playground=$!
trap 'kill "$playground" 2>/dev/null || true; wait "$playground" 2>/dev/null || true' EXIT

echo "waiting for PD on 127.0.0.1:2379 ..."
for _ in $(seq 1 120); do
  if curl -sf http://127.0.0.1:2379/pd/api/v1/stores 2>/dev/null | grep -q '"state_name": *"Up"'; then
    break
  fi
  sleep 2
done
curl -sf http://127.0.0.1:2379/pd/api/v1/stores | grep -q '"state_name": *"Up"' || {
  echo "TiKV did not come up; playground log:" >&2
  cat "$log" >&2
  exit 1
}

# Each test uses its own random shard prefix, so runs do not interfere.
KSHARD_TEST_PD=127.0.0.1:2379 cargo nextest run --locked --no-fail-fast --features tikv \
  --test storage_conformance --test replicas
