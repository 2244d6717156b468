#!/usr/bin/env bash
# Install into .venv, pack the CPU demo model if the store has none, and serve it on :3000.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/bootstrap.sh
export BENTOML_DO_NOT_TRACK=true HF_HUB_OFFLINE=1
export TRTLLM_MODEL="${TRTLLM_MODEL:-trtllm-demo:latest}"
if ! .venv/bin/bentoml models get "$TRTLLM_MODEL" >/dev/null 2>&1; then
  .venv/bin/python pack_model.py --demo
fi
exec .venv/bin/bentoml serve service:TRTLLM --host "${HOST:-127.0.0.1}" --port "${PORT:-3000}"
