#!/usr/bin/env bash
# Create .venv in the repository root and install what the CPU path and the tests need.
# Idempotent: reinstalls only when a requirements file changed. PYTHON picks the interpreter and
# VENV the environment's folder (the unit tests also run on Python 3.12 in .venv-py312).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
venv="${VENV:-.venv}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: Python >= 3.11 is required (found $("$python" --version 2>&1))" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
stamp="$venv/.requirements.sha256"
wanted="$(cat requirements.txt requirements-cpu.txt requirements-dev.txt requirements-guided.txt \
  requirements-modelopt.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "bootstrap: installing requirements into $venv (about a minute on a fresh machine)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # Without an NVIDIA GPU, torch's CPU build: on plain PyPI the pinned release resolves to the
  # CUDA build, which pulls several GB of nvidia packages the CPU path never uses. Where pip
  # already finds a CPU build (a local wheel folder), nothing changes.
  torch_pin="$(grep -E '^torch==' requirements-cpu.txt)"
  cpu_index=https://download.pytorch.org/whl/cpu
  if ! "$venv/bin/python" -c 'import socket; socket.getaddrinfo("download.pytorch.org", 443)' 2>/dev/null; then
    cpu_index=""  # not reachable from here: pip would retry it for minutes before PyPI's build
  fi
  if [ -n "$cpu_index" ] && ! command -v nvidia-smi >/dev/null &&
    ! "$venv/bin/python" -c "import torch" 2>/dev/null &&
    "$venv/bin/python" -m pip install --dry-run --quiet --report - "$torch_pin" 2>/dev/null |
    "$venv/bin/python" -c 'import json, sys; sys.exit(not any(i["metadata"]["name"].startswith("nvidia-") for i in json.load(sys.stdin)["install"]))'; then
    echo "bootstrap: no NVIDIA GPU: $torch_pin from PyTorch's CPU wheel index"
    "$venv/bin/python" -m pip install --quiet "$torch_pin" --index-url "$cpu_index" \
      --extra-index-url https://pypi.org/simple
  fi
  "$venv/bin/python" -m pip install --quiet -r requirements-dev.txt
  # xgrammar without its GPU-only `triton` dependency (see requirements-guided.txt).
  "$venv/bin/python" -m pip install --quiet --no-deps -r requirements-guided.txt
  # NVIDIA ModelOpt (pack_model.py --quantize) without its dependency list: its imports are
  # pinned in requirements-dev.txt (see requirements-modelopt.txt).
  "$venv/bin/python" -m pip install --quiet --no-deps -r requirements-modelopt.txt
  echo "$wanted" > "$stamp"
fi
