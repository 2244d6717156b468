#!/usr/bin/env bash
# Install into .venv (the pinned coding-agent CLIs into .agent-clis/ with npm, lm-eval into
# .lm-eval-venv/, vllm-router into .router-venv/, podman and debootstrap from Debian's packages
# for the container test), then lint and run every test (unit + real tritonserver / bentoml serve
# / the real client libraries, CLIs and router / the Bento's image built and run with podman),
# then the unit tests on Python 3.12 too (scripts/test-py312.sh).
# The tests run in PYTEST_WORKERS processes (2; 1 runs them in this process), a test file per
# process at a time: most of an integration test's time is a server starting or answering.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/bootstrap.sh
./scripts/install-agent-clis.sh
./scripts/install-lm-eval.sh
./scripts/install-router.sh
./scripts/install-containers.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
workers="${PYTEST_WORKERS:-2}"
if [ "$workers" -gt 1 ]; then
  set -- -n "$workers" --dist loadfile "$@"
fi
.venv/bin/python -m pytest "$@"
./scripts/test-py312.sh
