#!/usr/bin/env bash
# Install vllm-router (a Rust router in a Python wheel), which scripts/serve-replicas.sh puts in
# front of replicas and tests/integration/test_router.py drives, into .router-venv/ (ignored by
# git). A venv of its own: in .venv it would add FastAPI, which the service never imports, and a
# test run could then hide an accidental import. Reused while the pin is unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
VLLM_ROUTER_VERSION="0.1.17"
venv=.router-venv
wanted="vllm-router==$VLLM_ROUTER_VERSION"
if [ -f "$venv/.pins" ] && [ "$(cat "$venv/.pins")" = "$wanted" ] && [ -x "$venv/bin/vllm-router" ]; then
  exit 0
fi
echo "install-router: installing $wanted into $venv"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "$wanted"
echo "$wanted" > "$venv/.pins"
