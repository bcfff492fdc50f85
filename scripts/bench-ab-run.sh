#!/bin/bash
# A/B of two keymaster builds on many cores, beside nginx: `keymaster` (A, also the bench)
# and `keymaster-b` (B, run as a --peer with the same `proxy` command line), from a folder
# made by `KM=A KM_B=B scripts/stage-many-core-run.sh DIR`. Every system pinned to the same
# W workers, 1 KB, CONNS connections, REP repeats (each a full pass over the three), so that
# the two builds' samples interleave. The bench's folder is tarred into $OUT/$TAG.tar.gz.
# Knobs: W (8), SCEN (saturation: keep-alive; churn: a new connection per request), REP (3),
# DUR (4s), CONNS (256), TAG (ab), LIMIT (seconds, 150), B_ARGS (more `proxy` arguments for B:
# the same build twice with B_ARGS is an A/B of a setting).
set -u
D=$(cd "$(dirname "$0")" && pwd)
export PATH="$D/bin:$PATH"
OUT=${OUT:-/tmp/ab-out}
mkdir -p "$OUT" /var/lib/nginx /var/log/nginx 2>/dev/null
W=${W:-8}
REP=${REP:-3}
DUR=${DUR:-4s}
CONNS=${CONNS:-256}
SCEN=${SCEN:-saturation}
TAG=${TAG:-ab}
[ -x "$D/keymaster-b" ] || { echo "no $D/keymaster-b: stage with KM_B=..." >&2; exit 1; }
echo "cpus $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
rm -rf "/tmp/$TAG"
timeout "${LIMIT:-150}" "$D/keymaster" bench --pin --workers "$W" --only keymaster,nginx,b \
  --peer "b=$D/keymaster-b proxy --listen {listen} --to {origin} --workers {workers} ${B_ARGS:-}" \
  --scenario "$SCEN" --saturation-connections "$CONNS" --churn-connections "$CONNS" \
  -d "$DUR" --settle 1s --warmup 2s --repeats "$REP" --out "/tmp/$TAG" > "/tmp/$TAG.log" 2>&1
echo "exit $?"
grep -E "$SCEN|failed" "/tmp/$TAG.log"
tar -C /tmp -czf "$OUT/$TAG.tar.gz" "$TAG" "$TAG.log"
