#!/usr/bin/env bash
# Issue 4's filter chains in the bake-off itself: `keymaster bench` with three peers, each a
# `keymaster run` of one config (no filters, three native, three Lua: lib/filter-configs.sh),
# measured side by side in one run with the harness's CPU per request, latency and RSS.
# scripts/filter-cpu-per-request.sh is the lighter, more repeatable measure of CPU alone.
#
# usage: scripts/filter-bakeoff.sh [keymaster bench options]
#        (default: --scenario saturation --pin -d 5s --repeats 3)
# needs: target/release/keymaster
set -euo pipefail
KM=${KM:-$(cd "$(dirname "$0")/.." && pwd)/target/release/keymaster}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The configs with placeholders the peer wrapper fills in with the harness's addresses.
PORT=LISTEN_PORT
STUB_PORT=ORIGIN_PORT
# shellcheck source=lib/filter-configs.sh
. "$(dirname "$0")/lib/filter-configs.sh"
for c in none native lua; do
  sed -e 's/127\.0\.0\.1:LISTEN_PORT/@LISTEN@/; s/127\.0\.0\.1:ORIGIN_PORT/@ORIGIN@/g' \
    "$WORK/$c.toml" > "$WORK/$c.toml.in"
done
# The peer: fill in the addresses, then exec keymaster (the harness measures this pid).
cat > "$WORK/peer.sh" <<PEER
#!/bin/sh
sed -e "s/@LISTEN@/\$2/; s/@ORIGIN@/\$3/g" "$WORK/\$1.toml.in" > "$WORK/\$1.\$\$.toml"
exec "$KM" run --config "$WORK/\$1.\$\$.toml"
PEER
chmod +x "$WORK/peer.sh"
[ $# -gt 0 ] || set -- --scenario saturation --pin -d 5s --repeats 3
"$KM" bench --only none,native,lua \
  --peer "none=$WORK/peer.sh none {listen} {origin}" \
  --peer "native=$WORK/peer.sh native {listen} {origin}" \
  --peer "lua=$WORK/peer.sh lua {listen} {origin}" \
  "$@"
