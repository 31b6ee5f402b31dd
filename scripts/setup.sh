#!/usr/bin/env bash
# Sets wstrain up in the project's own virtual environment, .venv/ (Debian's system Python
# refuses pip installs outside one, PEP 668). Idempotent, from any directory:
#
#   bash scripts/setup.sh serve   # what `wstrain serve` needs: redis-server, CPU torch, wstrain
#   bash scripts/setup.sh test    # + the test and lint extras, and promtool for the metrics tests
#
# PYTHON picks the interpreter that makes the venv (default python3); an existing, working
# .venv is kept whatever made it. A second run that has nothing to install takes well under a
# second: each install leaves a stamp (.venv/.installed-ROLE) newer than pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-serve}"
case "$what" in serve|test) ;; *) echo "usage: $0 [serve|test]" >&2; exit 2 ;; esac
PY="${PYTHON:-python3}"
VPY=.venv/bin/python

apt_install() {  # Debian/Ubuntu packages, only those asked for (the callers ask for missing ones)
  [ $# -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: $*" >&2; exit 1; }
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null || { echo "setup: no apt-get; install these: $*" >&2; exit 1; }
  echo "setup: apt-get install $*"
  # env inside sudo: sudo drops the caller's environment; noninteractive: no debconf prompts
  "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]+"${sudo[@]}"}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

venv_works() {  # a venv whose interpreter still exists (pyenv versions come and go) and has pip
  [ -x "$VPY" ] && "$VPY" -c "import pip" 2>/dev/null
}

# Quick path: a stamp newer than pyproject.toml, the console script it installed and an OS
# binary for each role mean there is nothing to do; a test install serves `serve` as well.
ready() {
  [ -x "$VPY" ] && [ -x .venv/bin/wstrain ] && command -v redis-server >/dev/null || return 1
  if [ "$what" = test ]; then
    for tool in promtool prometheus-node-exporter amtool chromium; do
      command -v "$tool" >/dev/null || return 1
    done
  fi
  for stamp in ".venv/.installed-$what" .venv/.installed-test; do
    if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then return 0; fi
  done
  return 1
}
ready && exit 0

# OS packages: Redis for every run. The tests also run the real Prometheus (package
# prometheus: promtool, the server), node-exporter beside it, amtool (package
# prometheus-alertmanager) on the Alertmanager config, and headless Chromium on the report.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
if [ "$what" = test ]; then
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v prometheus-node-exporter >/dev/null || missing+=(prometheus-node-exporter)
  command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
  command -v chromium >/dev/null || missing+=(chromium)
fi
if ! venv_works && ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
  # Debian and Ubuntu ship venv's ensurepip apart, per minor version (python3.11-venv, ...)
  missing+=("$("$PY" -c 'import sys; print("python3.%d-venv" % sys.version_info[1])')")
fi
apt_install "${missing[@]+"${missing[@]}"}"

if ! venv_works; then
  # --clear: a venv left half-made (no pip, or its interpreter gone) is made again
  echo "setup: creating .venv with $("$PY" --version 2>&1) ($(command -v "$PY"))"
  "$PY" -m venv --clear .venv
  rm -f .venv/.installed-*
fi
"$VPY" -m pip install -q --upgrade pip
# CPU torch 2.13.0 (a GPU host brings its own torch): the bare `torch>=2.5` requirement would
# pull a multi-GB CUDA build, so install the pinned CPU build first and let the range accept
# it. Skipped when the venv already imports a torch (any build: a GPU host's stays).
# --no-compile: pip's bytecode pass runs on one core (torch alone: 35 s with it, 16 s without,
# on CI's 2 cores) and compiles every module; Python compiles the ~2,500 a process imports on
# first import instead (8 CPU-s), unless PYTHONDONTWRITEBYTECODE is set: then compileall below
# does every module once on every core (28 s on 2 cores), or each process would compile torch
# again from source (the suite took 2,260 s instead of 870 s). scripts/test.sh unsets it.
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU)"
  "$VPY" -m pip install -q --no-compile "torch==2.13.0"
fi
if [ "$what" = test ]; then
  "$VPY" -m pip install -q --no-compile -e ".[test,lint]"
else
  "$VPY" -m pip install -q --no-compile -e .
fi
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  # a file that does not compile (a package's template or test data) is skipped, as pip does
  "$VPY" -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null || true
fi
touch ".venv/.installed-$what"
echo "setup: .venv ready ($what)"
