#!/usr/bin/env bash
# CPU time per proxied request for issue 4's filter chains, measured side by side: three
# gateways, one per config (no filters, three native filters, the same three in Lua; see
# lib/filter-configs.sh), run at the same time, each pinned to CPU 0 with one worker and each
# under its own fixed-rate load (keymaster's load generator and the stub share CPU 1).
# Keep-alive, 1000-byte bodies.
#
# Why: on a shared VM the CPU time a request costs drifts by +-15% from one second to the
# next (the host), so configs measured one after the other (filter-cpu-per-request.sh, which
# swaps them in one gateway by hot reload) differ by that much window to window. Measured in
# the same windows, the three see the same host: the per-window ratios to no filters then
# spread by about +-1% (three gateways with the same config measure within 0.5% of each
# other: CONFIGS="none none none"). The price: the three share a core, so each request finds
# less of its data in the caches than a gateway alone would; both scripts are reported.
#
# A window's CPU per request = the gateway's scheduler run time in it (all threads,
# /proc/PID/task/*/schedstat, nanoseconds) / the requests its fixed rate sent in it. Configs
# move between the three slots (ports, start order) from one round of processes to the next.
#
# usage: scripts/filter-cpu-side-by-side.sh [rate per gateway] [window seconds] [windows per round]
# env: KM (the binary), ROUNDS (default 12: each round starts new gateways), CONFIGS
# (default "none native lua"; repeat a name for an A/A check; `native:/path/to/keymaster`
# runs that config on another build, labelled `native@keymaster`: an A/B of two builds),
# CONNECTIONS (per load, 32)
# needs: target/release/keymaster, python3
set -euo pipefail
RATE=${1:-4000}
WINDOW=${2:-2}
WINDOWS=${3:-8}
ROUNDS=${ROUNDS:-12}
CONNECTIONS=${CONNECTIONS:-32}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18381
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# shellcheck source=lib/fixed-rate.sh
. "$(dirname "$0")/lib/fixed-rate.sh"
read -r -a SPECS <<<"${CONFIGS:-none native lua}"
N=${#SPECS[@]}
# Per slot config: its name, binary and label (a repeated label gets a suffix: none_2).
CONFIGS=() BINS=() LABELS=()
for ((k = 0; k < N; k++)); do
  c=${SPECS[$k]%%:*}
  b=$KM l=$c
  if [ "$c" != "${SPECS[$k]}" ]; then b=${SPECS[$k]#*:} && l="$c@$(basename "$b")"; fi
  for ((j = 0; j < k; j++)); do [ "${LABELS[$j]}" = "$l" ] && l="${l}_$((k + 1))"; done
  CONFIGS+=("$c") BINS+=("$b") LABELS+=("$l")
done
# The configs for each slot's port.
for ((s = 0; s < N; s++)); do
  mkdir -p "$WORK/slot$s"
  (WORK="$WORK/slot$s" PORT=$((18390 + s)) && . "$(dirname "$0")/lib/filter-configs.sh")
done

taskset -c 1 "$KM" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port $STUB_PORT


RUNS="$WORK/runs.txt"
for r in $(seq 1 "$ROUNDS"); do
  gws=() loads=() slot_label=()
  for ((s = 0; s < N; s++)); do
    k=$(((s + r - 1) % N)) # round r: slot s runs config k
    slot_label+=("${LABELS[$k]}")
    taskset -c 0 "${BINS[$k]}" run --config "$WORK/slot$s/${CONFIGS[$k]}.toml" >/dev/null 2>&1 &
    gws+=($!)
    PIDS+=($!)
    wait_port $((18390 + s))
  done
  secs=$((WINDOWS * WINDOW + WINDOWS / 2 + 10)) # every window, and the reads between them
  for ((s = 0; s < N; s++)); do
    taskset -c 1 "$KM" load --url "http://127.0.0.1:$((18390 + s))/?length=1000" -c "$CONNECTIONS" \
      -R "$RATE" -d "${secs}s" --warmup 1s -t 1 >"$WORK/load$s.txt" 2>&1 &
    loads+=($!)
    PIDS+=($!)
  done
  sleep 3
  for w in $(seq 1 "$WINDOWS"); do
    a=()
    for ((s = 0; s < N; s++)); do a+=("$(run_ns "${gws[$s]}")"); done
    sleep "$WINDOW"
    for ((s = 0; s < N; s++)); do
      b=$(run_ns "${gws[$s]}")
      us=$(us_per_request "${a[s]}" "$b" "$RATE" "$WINDOW")
      echo "$r.$w ${slot_label[$s]} $us" | tee -a "$RUNS" >&2
    done
  done
  for l in "${loads[@]}"; do kill "$l" 2>/dev/null || true; wait "$l" 2>/dev/null || true; done
  for ((s = 0; s < N; s++)); do
    fail_on_load_errors "$WORK/load$s.txt" "${slot_label[$s]}"
  done
  for g in "${gws[@]}"; do kill "$g"; wait "$g" 2>/dev/null || true; done
done
python3 "$(dirname "$0")/lib/paired-report.py" "$RUNS" \
  "gateway CPU per request at a fixed rate, side by side (scheduler run time / requests)"
