#!/usr/bin/env bash
# The run command: set up (idempotent), then API + one scheduler agent + a private Redis
# (unless REDIS_URL is set) on http://127.0.0.1:8000. Extra arguments go to `wstrain serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec wstrain serve "$@"
