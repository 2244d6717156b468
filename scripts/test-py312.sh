#!/usr/bin/env bash
# The unit tests on Python 3.12 as well (NGC images' Python; the suite runs on 3.11, the floor),
# in .venv-py312. Python 3.12 is python3.12 on PATH, or pyenv's; without one this says so and
# skips. On a machine where PyTorch's CPU wheel index cannot be reached, torch is PyPI's build
# (with CUDA libraries, a few GB, once: the environment is reused while requirements hold).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="$(command -v python3.12 || true)"
if [ -n "$python" ] && ! "$python" -c 'import sys' 2>/dev/null; then
  python=""  # a pyenv shim of a version not selected here
fi
if [ -z "$python" ] && command -v pyenv >/dev/null; then
  python="$(ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -1)"
fi
if [ -z "$python" ]; then
  echo "test-py312: SKIPPED: no Python 3.12 here (install it, e.g. pyenv install 3.12, to run the unit tests on it)" >&2
  exit 0
fi
PYTHON="$python" VENV=.venv-py312 ./scripts/bootstrap.sh
workers="${PYTEST_WORKERS:-2}"
args=()
if [ "$workers" -gt 1 ]; then
  args=(-n "$workers" --dist loadfile)
fi
.venv-py312/bin/python -m pytest -q "${args[@]}" tests/unit "$@"
