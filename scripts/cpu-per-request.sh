#!/usr/bin/env bash
# CPU time per proxied request: keymaster vs nginx vs HAProxy, same machine, same run.
#
# The system under test (SUT) runs with one worker pinned to CPU 0; the stub origin and wrk
# share CPU 1. Keep-alive both sides, 1000-byte bodies, access logs off, upstream keep-alive on.
# CPU per request = (utime + stime of every SUT process and thread) / requests completed,
# shown split into user and system time.
#
# RATE=N: an open loop at N requests/s (keymaster's own generator) instead of wrk's closed
# loop, so that neither the system under test nor the rig is saturated.
#
# usage: [RATE=N] scripts/cpu-per-request.sh [connections] [seconds] [path]
# needs: target/release/keymaster, wrk, nginx and/or haproxy (apt-get install wrk nginx-light haproxy)
set -euo pipefail
CONNS=${1:-50}
SECS=${2:-10}
URLPATH=${3:-/?length=1000}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18081
TICK=$(getconf CLK_TCK)
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

taskset -c 1 "$KM" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port $STUB_PORT

# One measured load on PORT: prints "requests req/s p50 p99 errors" (latencies with units).
# Closed loop with wrk, or with RATE set an open loop at RATE req/s (keymaster's generator).
load() { # port seconds
  local url="http://127.0.0.1:$1$URLPATH"
  if [ -z "${RATE:-}" ]; then
    local out; out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"$2s" --latency "$url")
    local errs; errs=$(echo "$out" | grep -E "Non-2xx|Socket errors" | tr '\n' ' ' || true)
    echo "$(echo "$out" | awk '/requests in/ {r=$1} /Requests\/sec/ {s=$2} $1=="50%" {p=$2} $1=="99%" {q=$2} END {print r, s, p, q}') $errs"
  else
    taskset -c 1 "$KM" load --url "$url" -c "$CONNS" -R "$RATE" -t 1 -d "$2s" --warmup 0s --json 2>/dev/null |
      python3 -c 'import json, sys
d = json.load(sys.stdin); l = d["latency_ms"]
bad = sum(d["errors"].values()) + d["status"]["s4xx"] + d["status"]["s5xx"] + d["unsent"]
print(d["requests"], round(d["requests_per_sec"]), "%.2fms" % l["p50"], "%.2fms" % l["p99"], "failed: %d" % bad if bad else "")'
  fi
}

run_one() { # name port pid
  local name=$1 port=$2 pid=$3
  wait_port "$port"
  load "$port" 2 >/dev/null  # warm-up
  local u0 s0 u1 s1 reqs rps p50 p99 errs
  read -r u0 s0 < <(cpu_ticks_split "$pid")
  read -r reqs rps p50 p99 errs < <(load "$port" "$SECS")
  read -r u1 s1 < <(cpu_ticks_split "$pid")
  local rss; rss=$(awk '/VmRSS/ {print $2}' /proc/"$pid"/status)
  local per_req; per_req=$(awk -v u=$((u1-u0)) -v s=$((s1-s0)) -v hz="$TICK" -v r="$reqs" \
    'BEGIN { k = 1e6 / hz / r; printf "%6.1f us (user %.2f, sys %.2f)", (u + s) * k, u * k, s * k }')
  printf "%-10s %10s req/s  p50 %8s  p99 %8s  cpu/req %s  rss %6s KiB  %s\n" "$name" "$rps" "$p50" "$p99" "$per_req" "$rss" "$errs"
}

# keymaster: one worker on CPU 0.
taskset -c 0 "$KM" proxy --listen 127.0.0.1:18090 --to 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
run_one keymaster 18090 "${PIDS[-1]}"
kill "${PIDS[-1]}"

if command -v nginx >/dev/null; then
  cat > "$WORK/nginx.conf" <<NGX
worker_processes 1;
worker_cpu_affinity 01;
daemon off;
master_process off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 10240; }
http {
  access_log off;
  upstream origin { server 127.0.0.1:$STUB_PORT; keepalive 1024; }
  server {
    listen 127.0.0.1:18091 reuseport;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGX
  taskset -c 0 nginx -c "$WORK/nginx.conf" & PIDS+=($!)
  run_one nginx 18091 "${PIDS[-1]}"
  kill "${PIDS[-1]}"
else
  echo "nginx        not installed: skipped"
fi

if command -v haproxy >/dev/null; then
  cat > "$WORK/haproxy.cfg" <<HAP
global
  nbthread 1
  cpu-map 1/1 0
  maxconn 8000
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:18092
  default_backend be
backend be
  server s1 127.0.0.1:$STUB_PORT
HAP
  taskset -c 0 haproxy -f "$WORK/haproxy.cfg" -db >/dev/null 2>&1 & PIDS+=($!)
  run_one haproxy 18092 "${PIDS[-1]}"
  kill "${PIDS[-1]}"
else
  echo "haproxy      not installed: skipped"
fi
