#!/usr/bin/env bash
# The code and cache footprint of issue 4's filter chains, deterministically: callgrind with
# its cache simulation (32 KB 8-way L1 caches) on `keymaster run` with one worker, one
# keep-alive connection driven request by request (lib/callgrind-common.sh). Per config and
# per request, the difference of an N1- and an N2-request run over N2 - N1: instructions,
# L1 instruction-cache misses and L1 data-cache read misses. Then the 64-byte lines of code
# each config runs at least once per request that the first config never runs, by function
# (from the N2 run's per-instruction counts): the code a chain adds, which is what its CPU
# cost follows (docs/benchmarks.md, "Tenth session").
#
# usage: scripts/filter-code-footprint.sh [N1] [N2]
# needs: valgrind, python3, target/release/keymaster
# env: KM (the binary), CONFIGS (default "none native"; the first one is the base),
# STUB_PORT and PORT (defaults 18681 and 18690)
set -euo pipefail
N1=${1:-500}
N2=${2:-2500}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=${STUB_PORT:-18681}
PORT=${PORT:-18690}
LIB=$(cd "$(dirname "$0")/lib" && pwd)
# shellcheck source=lib/callgrind-common.sh
. "$LIB/callgrind-common.sh"
# shellcheck source=lib/filter-configs.sh
. "$LIB/filter-configs.sh"

run() { # config count -> the callgrind output file
  local out="$WORK/$1.$2.cg"
  valgrind --tool=callgrind --cache-sim=yes --dump-instr=yes --compress-pos=no \
    --compress-strings=no --callgrind-out-file="$out" "$KM" run --config "$WORK/$1.toml" \
    >"$out.log" 2>&1 &
  local vpid=$!
  wait_port "$PORT"
  drive "$PORT" "$2"
  kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
}

read -r -a CS <<<"${CONFIGS:-none native}"
for c in "${CS[@]}"; do
  run "$c" "$N1"
  run "$c" "$N2"
done
python3 "$LIB/code-lines.py" "$WORK" "$N1" "$N2" "${CS[@]}"
