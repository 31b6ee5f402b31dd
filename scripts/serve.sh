#!/usr/bin/env bash
# The run command, from any directory: set up (scripts/setup.sh serve; quick when done), then
# the API, one scheduler agent and a private Redis (unless REDIS_URL is set) on
# http://127.0.0.1:8000. Arguments go to `wstrain serve` (--host, --port, --state-dir).
# Ctrl-C stops it all.
#
#   bash scripts/serve.sh [--port 8000]
set -euo pipefail
cd "$(dirname "$0")/.."   # data roots default to ".": the examples resolve from here
bash scripts/setup.sh serve
echo "wstrain: in another shell, from $(pwd): .venv/bin/wstrain submit examples/tiny-llama.yaml --follow"
exec .venv/bin/wstrain serve "$@"
