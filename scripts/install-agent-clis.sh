#!/usr/bin/env bash
# Install the coding-agent CLIs the agent-client tests drive (Claude Code, Codex CLI), at pinned
# versions, with npm into .agent-clis/ (ignored by git). Reused while the pins are unchanged.
# Without node and npm it says so and exits 0: those tests then skip with the same message.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
CLAUDE_CODE_VERSION="2.1.332"
CODEX_VERSION="0.171.0"
wanted="claude-code@$CLAUDE_CODE_VERSION codex@$CODEX_VERSION"
prefix=.agent-clis
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "install-agent-clis: node and npm are not installed: the agent-client tests will skip" \
    "(Debian: apt-get install nodejs npm)" >&2
  exit 0
fi
if [ -f "$prefix/.pins" ] && [ "$(cat "$prefix/.pins")" = "$wanted" ]; then
  exit 0
fi
echo "install-agent-clis: installing $wanted into $prefix (npm)"
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
echo "$wanted" > "$prefix/.pins"
