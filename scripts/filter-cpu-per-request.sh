#!/usr/bin/env bash
# CPU time per proxied request for issue 4's filter chains: no filters, three native filters,
# the same three as Lua filters (see lib/filter-configs.sh). The measure the issue's budgets
# are written in (CPU per request, kernel included), where filter-instructions-per-request.sh
# counts user-space instructions only.
#
# The gateway runs `keymaster run` with one worker pinned to CPU 0; the stub and wrk share CPU
# 1. Keep-alive, 1000-byte bodies. The three configs are measured in turn, ROUNDS times
# (interleaved, so drift on a shared machine hits all three alike); the report is the median
# per config. CPU per request = (utime + stime of the gateway) / requests completed.
#
# usage: scripts/filter-cpu-per-request.sh [connections] [seconds] [rounds]
# needs: target/release/keymaster, wrk
set -euo pipefail
CONNS=${1:-50}
SECS=${2:-8}
ROUNDS=${3:-3}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18381
PORT=18390
TICK=$(getconf CLK_TCK)
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# shellcheck source=lib/filter-configs.sh
. "$(dirname "$0")/lib/filter-configs.sh"

taskset -c 1 "$KM" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port $STUB_PORT

one() { # config -> prints "us_per_req"
  taskset -c 0 "$KM" run --config "$WORK/$1.toml" >/dev/null 2>&1 &
  local pid=$!
  wait_port $PORT
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$PORT/?length=1000" >/dev/null
  local before after reqs
  before=$(awk '{print $14 + $15}' /proc/$pid/stat)
  reqs=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$PORT/?length=1000" | awk '/requests in/ {print $1}')
  after=$(awk '{print $14 + $15}' /proc/$pid/stat)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  awk -v t=$((after - before)) -v hz="$TICK" -v r="$reqs" 'BEGIN { printf "%.2f\n", t / hz * 1e6 / r }'
}

declare -A results
for _ in $(seq 1 "$ROUNDS"); do
  for c in none native lua; do
    results[$c]="${results[$c]:-} $(one $c)"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base_us=$(echo "${results[none]}" | median)
for c in none native lua; do
  m=$(echo "${results[$c]}" | median)
  awk -v n="$c" -v m="$m" -v b="$base_us" -v all="${results[$c]}" \
    'BEGIN { printf "%-8s %6.2f us CPU/request  %+6.1f%% vs none   (runs:%s)\n", n, m, (m / b - 1) * 100, all }'
done
