#!/bin/bash
# The many-core bake-off in one go (issue 26), for keymaster, nginx and HAProxy with the same
# workers, pinned (`keymaster bench --pin`: the system under test on the first CPUs, the stub
# and generator on the rest). Phases, most wanted first, each skipped when the time left
# (BUDGET seconds from the start) cannot hold its timeout:
#   scaling  at 1, 2, 4, 8 workers: saturation (1 KB, keep-alive, SATCONNS connections),
#            PERWORKER connections per worker against a 50 ms origin (the ramp's step), and
#            churn (a new connection per request, CHURNCONNS connections);
#   bodies   at WORKERS workers, keymaster and nginx: saturation with BODIES response sizes;
#   ramp     at WORKERS workers: 1 KB, 50 ms origin, CONNS connections (the 2013 preset's
#            ends, then on to 16,000).
# A sampler writes /proc/loadavg every second (LdAvg); steps.txt has each phase's start and
# end. Everything is tarred into $OUT/bench16.tar.gz after every phase; at the end
# bench-scale-report.py writes $OUT/report/ (tables.md, results.csv, workers-scaling.svg).
# Knobs (for a short local check): SCALE, WORKERS, PERWORKER, SATCONNS, BODIES, BODYCONNS,
# CHURNCONNS, CONNS, RAMPONLY (systems), RAMPLIMIT (seconds), DUR, WARM, SETTLE, BUDGET; a
# phase list set to " " skips it (SCALE=" " BODIES=" ": the ramp alone).
set -u
D=$(cd "$(dirname "$0")" && pwd)
export PATH="$D/bin:$PATH"
OUT=${OUT:-/tmp/devout}
mkdir -p "$OUT"
R=/tmp/km-bench
rm -rf "$R"
mkdir -p "$R"
START=$(date +%s)
# The most descriptors this machine lets the run have (the bench and keymaster raise their
# soft limit to the hard one).
for n in 1048576 524288 262144 131072 65536; do ulimit -n "$n" 2>/dev/null && break; done
mkdir -p /var/lib/nginx /var/log/nginx 2>/dev/null || true
KM="$D/keymaster"
SCALE=${SCALE:-"1 2 4 8"}
WORKERS=${WORKERS:-8}
PERWORKER=${PERWORKER:-1600}
SATCONNS=${SATCONNS:-256}
BODIES=${BODIES:-"10KB 100KB 1MB"}
BODYCONNS=${BODYCONNS:-64}
CHURNCONNS=${CHURNCONNS:-256}
CONNS=${CONNS:-700,2000,8000,16000}
RAMPONLY=${RAMPONLY:-keymaster,nginx,haproxy}
RAMPLIMIT=${RAMPLIMIT:-170}
DUR=${DUR:-4s}
WARM=${WARM:-2s}
SETTLE=${SETTLE:-1s}
BUDGET=${BUDGET:-540}
( while :; do echo "$(date +%s) $(cat /proc/loadavg)"; sleep 1; done ) > "$R/loadavg.txt" 2>/dev/null &
SAMPLER=$!
{
  echo "cpus: $(nproc)"
  uname -a
  grep -m1 "model name" /proc/cpuinfo
  echo "open files: soft $(ulimit -n) hard $(ulimit -Hn); fs.nr_open $(cat /proc/sys/fs/nr_open 2>/dev/null); fs.file-max $(cat /proc/sys/fs/file-max 2>/dev/null)"
  grep -E "^Cap(Eff|Bnd)" /proc/self/status
  "$KM" --version
  nginx -v 2>&1
  haproxy -v | head -1
  date -u
} > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
pin() { if [ "$(nproc)" -gt "$1" ]; then echo --pin; fi; }   # no pinning where the CPUs do not leave room

# step NAME TIMEOUT WORKERS ARGS...: one `keymaster bench` into $R/NAME, unless too little
# time is left for its timeout.
step() {
  local name=$1 limit=$2 w=$3
  shift 3
  if [ $(($(date +%s) + limit)) -gt $((START + BUDGET)) ]; then
    echo "== $name: skipped, ${limit}s do not fit in the ${BUDGET}s budget" | tee -a "$R/steps.txt"
    return
  fi
  echo "== $name ($(date +%s))" | tee -a "$R/steps.txt"
  timeout "$limit" "$KM" bench $(pin "$w") --workers "$w" -d "$DUR" --settle "$SETTLE" \
    --warmup "$WARM" --out "$R/$name" "$@" > "$R/$name.log" 2>&1
  echo "exit $? ($(date +%s))" | tee -a "$R/steps.txt"
  grep -E "^\| (keymaster|nginx|haproxy) " "$R/$name/report.md" 2>/dev/null | grep -v "| ran |" | cut -c1-120
  tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench   # what is done so far comes back
}

for w in $SCALE; do
  step "scale-w$w" $((75 + 8 * w)) "$w" --only keymaster,nginx,haproxy \
    --scenario saturation,ramp,churn --saturation-connections "$SATCONNS" \
    --connections $((PERWORKER * w)) --churn-connections "$CHURNCONNS"
done
for b in $BODIES; do
  step "body-$b-w$WORKERS" 40 "$WORKERS" --only keymaster,nginx \
    --scenario saturation --saturation-connections "$BODYCONNS" --body "$b"
done
step "ramp-w$WORKERS" "$RAMPLIMIT" "$WORKERS" --only "$RAMPONLY" --scenario ramp --connections "$CONNS"
kill "$SAMPLER" 2>/dev/null
tar -C /tmp -czf "$OUT/bench16.tar.gz" km-bench
cp "$R/machine.txt" "$OUT/machine.txt"
python3 "$D/bench-scale-report.py" "$R" "$OUT/report" > /dev/null && cat "$OUT/report/tables.md"
echo "done in $(($(date +%s) - START))s"
ls -la "$OUT"
