#!/usr/bin/env bash
# Create .venv in the repository root and install what the CPU path and the tests need.
# Idempotent: reinstalls only when a requirements file changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "bootstrap: Python >= 3.11 is required (found $("$python" --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.requirements.sha256
wanted="$(cat requirements.txt requirements-cpu.txt requirements-dev.txt requirements-guided.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "bootstrap: installing requirements into .venv (about a minute on a fresh machine)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  # xgrammar without its GPU-only `triton` dependency (see requirements-guided.txt).
  .venv/bin/python -m pip install --quiet --no-deps -r requirements-guided.txt
  echo "$wanted" > "$stamp"
fi
