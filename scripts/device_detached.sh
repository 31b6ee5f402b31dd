#!/usr/bin/env bash
# A benchmark row longer than the device tool's 10-minute command (the 512K-token row on 4
# GPUs: a ~364 s step after four ranks page-lock ~100 GiB each), run across calls on the lent
# machine. `start` runs the command in a new process session, which the tool leaves running
# between calls while the machine is held (its README); `collect` copies what it wrote so far
# to $OUT and says whether it ended. Call `collect` again within the machine's idle release.
#
#   bash scripts/device_detached.sh start NAME python -m bench.data_parallel ... --out RESULT.json
#   bash scripts/device_detached.sh collect NAME [WAIT_S]   # exit 0: ended, 3: still running
#
# The command's output goes to LOG, the GPUs' clocks and power to GPUS.csv; its files are
# wherever it writes them (point --out into the run's folder, $DIR/NAME, so that collect
# brings them back).
set -euo pipefail
DIR=${WSTRAIN_DETACHED_DIR:-/tmp/wstrain-detached}
action=${1:?usage: device_detached.sh start NAME CMD... | collect NAME [WAIT_S]}
name=${2:?a run name}
run="$DIR/$name"
case "$action" in
  start)
    shift 2
    [ $# -gt 0 ] || { echo "start: no command given" >&2; exit 2; }
    mkdir -p "$run"
    # setsid: a new session, so the tool does not end it when this call returns. Beside the
    # command, every GPU's clocks, power and temperature each 10 s (GPUS.csv): a row slower
    # on four GPUs than on one (512K: 379 s a step against 338 s) may be the clocks
    setsid bash -c '
      if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
          --format=csv -l 10 >"$0/GPUS.csv" 2>&1 &
        smi=$!
      fi
      "$@" >"$0/LOG" 2>&1; rc=$?
      [ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
      echo $rc >"$0/RC"' "$run" "$@" </dev/null &
    echo "started $name (pid $!): $*"
    ;;
  collect)
    [ -d "$run" ] || { echo "collect: no run named $name under $DIR" >&2; exit 2; }
    wait_s=${3:-0}
    for _ in $(seq "$wait_s"); do [ -f "$run/RC" ] && break; sleep 1; done
    out=${OUT:-$run.out}
    mkdir -p "$out"
    cp -r "$run"/. "$out"/
    tail -n 20 "$run/LOG" || true
    if [ -f "$run/RC" ]; then
      echo "$name ended, exit status $(cat "$run/RC")"
      exit 0
    fi
    echo "$name still running"
    exit 3
    ;;
  *)
    echo "unknown action $action: start or collect" >&2
    exit 2
    ;;
esac
