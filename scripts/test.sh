#!/usr/bin/env bash
# The test command, from any directory: set up (scripts/setup.sh test), then the gates CI
# runs — ruff, ruff format --check, mypy, import-linter's layering contracts — and the whole
# suite. Tests start their own redis-server on a free loopback port, a real uvicorn and
# real agent and worker processes. Arguments go to pytest.
#
#   bash scripts/test.sh                 # everything (CI runs exactly this)
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end and Prometheus tests
#   bash scripts/test.sh -n 0 tests/api  # one area, serially (-n 0: no xdist workers)
#
# WSTRAIN_SKIP_LINT=1 skips the lint gates: for iterating on tests locally only; CI never
# sets it, so a change is done when the plain command passes.
set -euo pipefail
cd "$(dirname "$0")/.."   # the gates read pyproject.toml and lint "." from the repo root
# bytecode is written on first import (CI sets PYTHONDONTWRITEBYTECODE): the ~100 agent, worker
# and API processes the suite starts then read it, not compile torch and the project each
# time, and setup skips compiling all of site-packages ahead (28 s of CI's 2 cores)
unset PYTHONDONTWRITEBYTECODE
bash scripts/setup.sh test
V=.venv/bin

# ---- lint gates (configs: [tool.ruff], [tool.mypy], [tool.importlinter] in pyproject.toml)
if [ "${WSTRAIN_SKIP_LINT:-}" = 1 ]; then
  echo "== lint gates skipped (WSTRAIN_SKIP_LINT=1)"
else
  echo "== ruff check";        "$V/ruff" check .
  echo "== ruff format";       "$V/ruff" format --check .
  echo "== import contracts";  "$V/lint-imports"
  # mypy runs beside the suite (42 s of one core from a fresh clone, while the suite
  # leaves ~20% of CI's 2 cores idle waiting on its processes); its verdict comes after
  mypy_log="$(mktemp)"
  "$V/mypy" >"$mypy_log" 2>&1 &
  mypy_pid=$!
fi
# ---- end of lint gates

echo "== pytest"
# One xdist worker per core (2 on CI: about 28 minutes serially); tests/conftest.py gives each
# worker one BLAS thread, its own redis-server and free ports. --dist loadscope keeps a
# module's tests on one worker, so a module-scoped stack (API, agent) starts once, not once
# a worker. --durations=25 prints the slowest 25, the first place to look when CI slows.
# WSTRAIN_TEST_WORKERS=0 (or -n 0 among the arguments, which come last and win) runs serially.
workers="${WSTRAIN_TEST_WORKERS:-$(nproc)}"
# pytest exits 5 when it collected nothing; passed on unchanged, that fails this script and CI
# too (a filter that selects no test must not pass as green).
rc=0
"$V/python" -m pytest -q -n "$workers" --dist loadscope --durations=25 "$@" || rc=$?
if [ -n "${mypy_pid:-}" ]; then
  echo "== mypy"
  if wait "$mypy_pid"; then tail -1 "$mypy_log"; else cat "$mypy_log"; rc=1; fi
  rm -f "$mypy_log"
fi
exit "$rc"
