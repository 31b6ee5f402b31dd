#!/usr/bin/env bash
# The test command, from any directory: set up (scripts/setup.sh test), then the gates CI
# runs — ruff, ruff format --check, mypy, import-linter's layering contracts — and the whole
# suite. Tests start their own redis-server on a free loopback port, a real uvicorn and
# real agent and worker processes. Arguments go to pytest.
#
#   bash scripts/test.sh                 # everything (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end and Prometheus tests
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
V=.venv/bin
echo "== ruff check";        "$V/ruff" check .
echo "== ruff format";       "$V/ruff" format --check .
echo "== mypy";              "$V/mypy"
echo "== import contracts";  "$V/lint-imports"
echo "== pytest"
# pytest exits 5 when it collected nothing: that is a failure here too
exec "$V/python" -m pytest -q "$@"
