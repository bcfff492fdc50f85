#!/bin/bash
# The many-core bake-off in one go (issue 26): workers scaling (saturation, 1 KB, keep-alive,
# SATCONNS connections) for keymaster, nginx and HAProxy at 1, 2, 4, 8 workers, then the ramp
# (1 KB, 50 ms origin) over the 2013 preset's range (700 -> 2,000) and on to 16,000 connections
# at 8 workers. A sampler writes /proc/loadavg every second (LdAvg). Everything is tarred into $OUT.
# Knobs (for a short local check): SCALE, CONNS, WORKERS, DUR, WARM, SETTLE, SATCONNS, RAMPDUR.
set -u
D=$(cd "$(dirname "$0")" && pwd)
export PATH="$D/bin:$PATH"
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
R=/tmp/km-bench
rm -rf "$R"
mkdir -p "$R"
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
mkdir -p /var/lib/nginx /var/log/nginx 2>/dev/null || true
KM="$D/keymaster"
SCALE=${SCALE:-"1 2 4 8"}
CONNS=${CONNS:-700,1400,2000,4000,8000,16000}
WORKERS=${WORKERS:-8}
DUR=${DUR:-4s}
RAMPDUR=${RAMPDUR:-4s}
WARM=${WARM:-2s}
SETTLE=${SETTLE:-1s}
SATCONNS=${SATCONNS:-256}
( while :; do echo "$(date +%s) $(cat /proc/loadavg)"; sleep 1; done ) > "$R/loadavg.txt" 2>/dev/null &
SAMPLER=$!
{
  echo "cpus: $(nproc)"
  uname -a
  grep -m1 "model name" /proc/cpuinfo
  echo "open files: soft $(ulimit -n) hard $(ulimit -Hn)"
  "$KM" --version
  nginx -v 2>&1
  haproxy -v | head -1
  date -u
} > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
pin() { if [ "$(nproc)" -gt "$1" ]; then echo --pin; fi; }   # no pinning where the CPUs do not leave room
for w in $SCALE; do
  echo "== scaling: $w workers ($(date +%s))" | tee -a "$R/steps.txt"
  timeout 75 "$KM" bench $(pin "$w") --workers "$w" --only keymaster,nginx,haproxy \
    --scenario saturation --saturation-connections "$SATCONNS" -d "$DUR" --settle "$SETTLE" --warmup "$WARM" \
    --out "$R/scale-w$w" > "$R/scale-w$w.log" 2>&1
  echo "exit $? ($(date +%s))" | tee -a "$R/steps.txt"; grep -E "saturation" "$R/scale-w$w.log" | tail -3
  tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench   # what is done so far comes back
done
echo "== ramp: $WORKERS workers, $CONNS connections ($(date +%s))" | tee -a "$R/steps.txt"
timeout 230 "$KM" bench $(pin "$WORKERS") --workers "$WORKERS" --only keymaster,nginx,haproxy \
  --scenario ramp --connections "$CONNS" -d "$RAMPDUR" --settle "$SETTLE" --warmup "$WARM" \
  --out "$R/ramp-w$WORKERS" > "$R/ramp-w$WORKERS.log" 2>&1
echo "exit $? ($(date +%s))" | tee -a "$R/steps.txt"; grep -E "ramp" "$R/ramp-w$WORKERS.log" | tail -18
kill "$SAMPLER" 2>/dev/null
tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench
cp "$R/machine.txt" "$OUT/machine.txt"
ls -la "$OUT"
