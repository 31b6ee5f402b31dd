#!/usr/bin/env bash
# Sets wstrain up in the project's own virtual environment, .venv/ (Debian's system Python
# refuses pip installs outside one, PEP 668). Idempotent, from any directory:
#
#   bash scripts/setup.sh serve   # what `wstrain serve` needs: redis-server, CPU torch, wstrain
#   bash scripts/setup.sh test    # + the test and lint extras, and promtool for the metrics tests
#
# PYTHON picks the interpreter that makes the venv (default python3). A second run that has
# nothing to install takes about a second: each install leaves a stamp newer than
# pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-serve}"
case "$what" in serve|test) ;; *) echo "usage: $0 [serve|test]" >&2; exit 2 ;; esac

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {  # Debian/Ubuntu packages, only those missing
  [ $# -eq 0 ] && return 0
  echo "setup: apt-get install $*"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$@" >/dev/null
}

# OS packages: Redis for every run; promtool (package prometheus) only lints /metrics in tests.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
if [ "$what" = test ]; then command -v promtool >/dev/null || missing+=(prometheus); fi
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ] && ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
  missing+=(python3-venv)  # Debian ships venv's ensurepip separately
fi
apt_install "${missing[@]+"${missing[@]}"}"

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=".venv/.installed-$what"
for done_stamp in "$stamp" .venv/.installed-test; do  # a test install serves as well
  if [ -f "$done_stamp" ] && [ "$done_stamp" -nt pyproject.toml ]; then exit 0; fi
done
"$VPY" -m pip install -q --upgrade pip
# CPU torch 2.13.0 (a GPU host brings its own torch): a bare `torch` requirement would pull
# a multi-GB CUDA build, so install the pinned CPU build first and let `torch>=2.5` accept it.
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
if [ "$what" = test ]; then
  "$VPY" -m pip install -q -e ".[test,lint]"
else
  "$VPY" -m pip install -q -e .
fi
touch "$stamp"
echo "setup: .venv ready ($what)"
