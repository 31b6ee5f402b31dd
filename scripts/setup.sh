#!/usr/bin/env bash
# Installs everything wstrain needs on a fresh Debian/Ubuntu machine (idempotent):
# redis-server and prometheus (promtool) from the OS packages, CPU torch 2.13.0, and
# wstrain with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
# redis-server for the service; promtool (package prometheus) lints /metrics in the tests.
missing=""
command -v redis-server >/dev/null || missing="$missing redis-server"
command -v promtool >/dev/null || missing="$missing prometheus"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing >/dev/null
fi
PY="${PYTHON:-python3}"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"   # CPU build; a GPU host brings its own torch
fi
"$PY" -m pip install -q -e ".[test]"
