#!/usr/bin/env bash
# The run command, from any directory: set up (scripts/setup.sh serve; quick when done), then
# the API, one scheduler agent and a private Redis (unless REDIS_URL is set) on
# http://127.0.0.1:8000. Arguments go to `wstrain serve` (--host, --port, --state-dir).
# Ctrl-C stops it all: the agent (which checkpoints and requeues running jobs), then Redis.
#
#   bash scripts/serve.sh [--port 8000]
set -euo pipefail
# The repo root is the server's working directory: the data roots default to "." (the API
# process's CWD), so the examples' data (examples/data/..., which `wstrain submit` resolves
# against the spec file's directory) is readable, and the default state dir is
# ./wstrain-state (ignored by git).
cd "$(dirname "$0")/.."
bash scripts/setup.sh serve

# The hint names the server the client must talk to when --host/--port are not the defaults.
host=127.0.0.1 port=8000 prev=""
for arg in "$@"; do
  case "$prev" in --host) host=$arg ;; --port) port=$arg ;; esac
  case "$arg" in --host=*) host=${arg#--host=} ;; --port=*) port=${arg#--port=} ;; esac
  prev=$arg
done
case "$host" in 0.0.0.0|::|"[::]") host=127.0.0.1 ;; \[*) ;; *:*) host="[$host]" ;; esac
server=""
if [ "$host:$port" != 127.0.0.1:8000 ]; then server=" --server http://$host:$port"; fi
echo "wstrain: to train the demo, in another shell: cd $(pwd) && .venv/bin/wstrain$server submit examples/tiny-llama.yaml --follow"
exec .venv/bin/wstrain serve "$@"
