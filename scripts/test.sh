#!/usr/bin/env bash
# The test command: set up (idempotent), then the whole suite. Tests start their own
# redis-server on a free loopback port, a real uvicorn and real agent/worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
