#!/bin/bash
# The many-core bake-off in one go: workers scaling (saturation, 1 KB, keep-alive) for
# keymaster, nginx and HAProxy, then the ramp (1 KB, 50 ms origin) from the 2013 preset's
# range to 16,000 connections at 8 workers. Everything it writes is tarred into $OUT.
# Knobs (for a short local check): SCALE, CONNS, WORKERS, DUR, WARM, SETTLE.
#
# Made for a bare machine: copy it into a folder holding `keymaster` (a release build),
# `bin/nginx` and `bin/haproxy` (wrappers that run the carried binaries with
# LD_LIBRARY_PATH=lib), `real/` (those binaries) and `lib/` (their shared libraries, from
# `ldd`), then `OUT=dir ./bench-many-cores.sh`. On a machine with nginx and HAProxy
# installed the folder needs only `keymaster`.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export PATH="$D/bin:$PATH"
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
R=/tmp/km-bench
rm -rf "$R"
mkdir -p "$R"
ulimit -n 1048576 2>/dev/null || ulimit -n 262144 2>/dev/null || true
mkdir -p /var/lib/nginx /var/log/nginx 2>/dev/null || true
KM="$D/keymaster"
SCALE=${SCALE:-"1 2 4 8"}
CONNS=${CONNS:-700,1400,2000,4000,8000,16000}
WORKERS=${WORKERS:-8}
DUR=${DUR:-5s}
WARM=${WARM:-3s}
SETTLE=${SETTLE:-1s}
{
  echo "cpus: $(nproc)"
  uname -a
  grep -m1 "model name" /proc/cpuinfo
  echo "open files: $(ulimit -n)"
  "$KM" --version
  nginx -v 2>&1
  haproxy -v | head -1
  date -u
} > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
for w in $SCALE; do
  echo "== scaling: $w workers"
  timeout 100 "$KM" bench --pin --workers "$w" --only keymaster,nginx,haproxy \
    --scenario saturation -d "$DUR" --settle "$SETTLE" --warmup "$WARM" \
    --out "$R/scale-w$w" > "$R/scale-w$w.log" 2>&1
  echo "exit $?"; grep -E "saturation" "$R/scale-w$w.log" | tail -3
  tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench   # what is done so far comes back
done
echo "== ramp: $WORKERS workers, $CONNS connections"
timeout 280 "$KM" bench --pin --workers "$WORKERS" --only keymaster,nginx,haproxy \
  --scenario ramp --connections "$CONNS" -d "$DUR" --settle "$SETTLE" --warmup "$WARM" \
  --out "$R/ramp-w$WORKERS" > "$R/ramp-w$WORKERS.log" 2>&1
echo "exit $?"; grep -E "ramp" "$R/ramp-w$WORKERS.log" | tail -18
tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench
cp "$R/machine.txt" "$OUT/machine.txt"
ls -la "$OUT"
