#!/usr/bin/env bash
# Serve REPLICAS (2) replicas of a packed model behind vllm-router on HOST:PORT (127.0.0.1:3000).
#
#   ./scripts/serve-replicas.sh                          # kv_aware routing of the CPU demo model
#   POLICY=round_robin REPLICAS=3 ./scripts/serve-replicas.sh
#   ./scripts/serve-replicas.sh --kv-aware-session-affinity-ttl-secs 300   # more router options
#
# Each replica is a `bentoml serve` on its own loopback port (consecutive free ports from
# REPLICA_PORT, PORT + 1 by default) that publishes its KV-cache events on its own
# TRTLLM_KV_EVENTS_ENDPOINT (tcp://127.0.0.1:<port>, consecutive free ports from KV_EVENTS_PORT,
# 5557 by default). The router (POLICY: kv_aware by default; round_robin, power_of_two,
# cache_aware, ...) waits for every replica's /health, and with kv_aware subscribes to every
# replica's events. TRTLLM_MODEL picks the model (default: the demo with its prefix cache on,
# packed as trtllm-demo-reuse if the store has none); KV_BLOCK_SIZE overrides the block size the
# router cuts prompts by (default: the model's engine config, else 32, trtllm-build's default).
# Logs go to LOG_DIR (a new temporary directory unless set). Ctrl-C or SIGTERM stops the router
# and every replica; so does any of them exiting.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/bootstrap.sh
./scripts/install-router.sh
export BENTOML_DO_NOT_TRACK=true HF_HUB_OFFLINE=1
export TRTLLM_MODEL="${TRTLLM_MODEL:-trtllm-demo-reuse:latest}"
replicas="${REPLICAS:-2}"
policy="${POLICY:-kv_aware}"
host="${HOST:-127.0.0.1}"
port="${PORT:-3000}"
python=.venv/bin/python

if ! .venv/bin/bentoml models get "$TRTLLM_MODEL" >/dev/null 2>&1; then
  if [ "$TRTLLM_MODEL" != "trtllm-demo-reuse:latest" ]; then
    echo "serve-replicas: $TRTLLM_MODEL is not in the model store (pack it with pack_model.py)" >&2
    exit 1
  fi
  $python pack_model.py --demo --name trtllm-demo-reuse --enable-kv-cache-reuse true
fi
if ! $python -c 'import socket, sys; socket.create_server((sys.argv[1], int(sys.argv[2]))).close()' "$host" "$port" 2>/dev/null; then
  echo "serve-replicas: $host:$port is taken (or not an address here): use another, e.g. PORT=3100 $0" >&2
  exit 1
fi

# Two runs of consecutive free loopback ports (replicas, then their event publishers), apart
# from each other and from the router's port: nothing listens on them yet to tell.
read -r replica_base events_base < <($python - "${REPLICA_PORT:-$((port + 1))}" "${KV_EVENTS_PORT:-5557}" "$replicas" "$port" <<'PY'
import socket
import sys

replica_base, events_base, count, router_port = map(int, sys.argv[1:])
taken = {router_port}


def free(port: int) -> bool:
    if port in taken or port > 65535:
        return False
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError:
        return False
    return True


def run_from(base: int) -> int:
    for first in range(base, 65536 - count + 1):
        if all(free(first + i) for i in range(count)):
            taken.update(range(first, first + count))
            return first
    sys.exit(f"no {count} consecutive free ports from {base}")


print(run_from(replica_base), run_from(events_base))
PY
)

# The engine's KV block size, from the packed model: the router must cut prompts into the same
# blocks as the engine, or no lookup matches.
block_size="${KV_BLOCK_SIZE:-$($python - "$TRTLLM_MODEL" <<'PY'
import json
import sys
from pathlib import Path

import bentoml

for config in sorted(Path(bentoml.models.get(sys.argv[1]).path).rglob("config.json")):
    plugin = json.loads(config.read_text()).get("build_config", {}).get("plugin_config", {})
    if plugin.get("tokens_per_block"):
        print(plugin["tokens_per_block"])
        break
else:
    print(32)
PY
)}"

log_dir="${LOG_DIR:-$(mktemp -d -t serve-replicas.XXXXXX)}"
mkdir -p "$log_dir"
store="${BENTOML_HOME:-$HOME/bentoml}"
pids=()  # process-group leaders, replicas first, the router last

# Every process below the given ones (a replica's workers run in sessions of their own, out of
# reach of its process group).
descendants() {
  local pid child
  for pid in "$@"; do
    for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do
      echo "$child"
      descendants "$child"
    done
  done
}

stop_all() {
  trap - EXIT INT TERM
  local pid index tree
  mapfile -t tree < <(descendants "${pids[@]}")
  # The router first (no new requests), then the replicas: SIGTERM to each group, then, after
  # 40 s, SIGKILL to whatever is left (a replica stops its workers and tritonserver in order).
  for ((index = ${#pids[@]} - 1; index >= 0; index--)); do
    kill -TERM -- "-${pids[index]}" 2>/dev/null || true
  done
  local deadline=$((SECONDS + 40))
  for pid in "${pids[@]}"; do
    while kill -0 -- "-$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.2
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  for pid in "${tree[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Each child leads its own process group (setsid) and gets SIGTERM if this script dies, even
# by SIGKILL (setpriv --pdeathsig): nothing outlives the script.
spawn() {
  local log="$1"
  shift
  setsid setpriv --pdeathsig=TERM -- "$@" >"$log" 2>&1 &
  pids+=("$!")
}

workers=()
sources=()
for ((index = 0; index < replicas; index++)); do
  replica_port=$((replica_base + index))
  endpoint="tcp://127.0.0.1:$((events_base + index))"
  # A BentoML home per replica, sharing the model store: every `bentoml serve` empties its
  # home's metrics directory when it starts.
  home="$log_dir/bentoml-home-$index"
  mkdir -p "$home"
  ln -sfn "$store/models" "$home/models"
  BENTOML_HOME="$home" TRTLLM_KV_EVENTS_ENDPOINT="$endpoint" spawn "$log_dir/replica-$index.log" \
    .venv/bin/bentoml serve service:TRTLLM --host 127.0.0.1 --port "$replica_port"
  workers+=("http://127.0.0.1:$replica_port")
  sources+=(--kv-event-source "http://127.0.0.1:$replica_port=$endpoint")
  echo "serve-replicas: replica $index on http://127.0.0.1:$replica_port, KV events on $endpoint"
done

router_args=(--host "$host" --port "$port" --policy "$policy" --worker-urls "${workers[@]}"
  # It waits for every replica's /health; a large model may take long to load.
  --worker-startup-timeout-secs 1800 --worker-startup-check-interval 2)
if [ "$policy" = kv_aware ]; then
  router_args+=("${sources[@]}" --kv-event-block-size "$block_size"
    --kv-event-model "${TRTLLM_MODEL%%:*}")
fi
spawn "$log_dir/router.log" .router-venv/bin/vllm-router "${router_args[@]}" "$@"
echo "serve-replicas: vllm-router ($policy) on http://$host:$port once the replicas are ready;" \
  "logs in $log_dir"

# Until one of them exits: then stop the others (the EXIT trap).
set +e
wait -n "${pids[@]}"
status=$?
set -e
echo "serve-replicas: a process exited (status $status): stopping the others (logs in $log_dir)" >&2
exit 1
