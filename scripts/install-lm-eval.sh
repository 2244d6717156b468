#!/usr/bin/env bash
# Install lm-evaluation-harness, which tests/integration/test_lm_eval.py runs unmodified against
# `bentoml serve`, into .lm-eval-venv/ (ignored by git). A venv of its own: in .venv it would
# downgrade python-dateutil (its typepy[datetime] wants < 3) and add some 35 packages the service
# never imports. transformers and tokenizers come at .venv's versions, so lm-eval's huggingface
# tokenizer backend encodes as the service does. Reused while the pins are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
LM_EVAL_VERSION="0.4.13"
venv=.lm-eval-venv
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
# [api]: what its local-completions and local-chat-completions models import (aiohttp, tenacity).
requirements=(
  "lm-eval[api]==$LM_EVAL_VERSION"
  "transformers==$(version transformers)"
  "tokenizers==$(version tokenizers)"
)
wanted="${requirements[*]}"
if [ -f "$venv/.pins" ] && [ "$(cat "$venv/.pins")" = "$wanted" ]; then
  exit 0
fi
echo "install-lm-eval: installing $wanted into $venv (about a minute on a fresh machine)"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "${requirements[@]}"
echo "$wanted" > "$venv/.pins"
