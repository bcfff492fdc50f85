#!/usr/bin/env bash
# User-space instructions per proxied request under callgrind for the filter chain of issue 4:
# no filters, three native filters, and the same three as Lua filters (a pre filter setting a
# request header, a route filter choosing the cluster, a post filter adding a response
# header). Same method as scripts/instructions-per-request.sh: each config runs twice (N1 and
# N2 keep-alive requests on one connection); (I(N2) - I(N1)) / (N2 - N1) removes start-up.
#
# usage: scripts/filter-instructions-per-request.sh [N1] [N2]
# needs: valgrind, python3, target/release/keymaster
# env: KM (the binary), STUB_PORT and PORT (defaults 18281 and 18290), CONFIGS (default
# "none native lua")
set -euo pipefail
N1=${1:-200}
N2=${2:-700}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=${STUB_PORT:-18281}
PORT=${PORT:-18290}
# shellcheck source=lib/callgrind-common.sh
. "$(dirname "$0")/lib/callgrind-common.sh"

measure() { # config count
  local out="$WORK/$(basename "$1").$2.log"
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$KM" run --config "$1" >"$out" 2>&1 &
  local vpid=$!
  wait_port "$PORT"
  drive "$PORT" "$2"
  kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
  grep -h "Collected" "$out" | awk '{s += $NF} END {print s}'
}

# shellcheck source=lib/filter-configs.sh
. "$(dirname "$0")/lib/filter-configs.sh"

for c in ${CONFIGS:-none native lua}; do
  a=$(measure "$WORK/$c.toml" "$N1")
  b=$(measure "$WORK/$c.toml" "$N2")
  awk -v n="$c" -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
    'BEGIN { printf "%-8s %8.0f instructions/request\n", n, (b - a) / (n2 - n1) }'
done
