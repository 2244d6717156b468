#!/usr/bin/env bash
# Install into .venv, pack the CPU demo model if the store has none, and serve it on
# HOST:PORT (127.0.0.1:3000 unless set; TRTLLM_MODEL picks another packed model).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/bootstrap.sh
export BENTOML_DO_NOT_TRACK=true HF_HUB_OFFLINE=1
export TRTLLM_MODEL="${TRTLLM_MODEL:-trtllm-demo:latest}"
if ! .venv/bin/bentoml models get "$TRTLLM_MODEL" >/dev/null 2>&1; then
  .venv/bin/python pack_model.py --demo
fi
host="${HOST:-127.0.0.1}"
port="${PORT:-3000}"
if ! .venv/bin/python -c 'import socket, sys; socket.create_server((sys.argv[1], int(sys.argv[2]))).close()' "$host" "$port" 2>/dev/null; then
  echo "serve-demo: $host:$port is taken (or not an address here): serve on another, e.g. PORT=3001 $0" >&2
  exit 1
fi
exec .venv/bin/bentoml serve service:TRTLLM --host "$host" --port "$port"
