#!/usr/bin/env bash
# CPU time per request with response compression on: keymaster's gzip beside nginx's gzip at
# the same level, same machine, same run; keymaster's brotli and zstd at their defaults, and
# both without compression, for scale.
#
# The system under test (SUT) runs one worker pinned to CPU 0; the stub origin and wrk share
# CPU 1. wrk sends `Accept-Encoding: <algorithm>` on keep-alive connections; the stub sends
# LENGTH bytes of HTML-like text (`gzip=0`: never compressed by the stub itself) with a
# Content-Length. CPU per request = (utime + stime of every SUT process and thread) / requests
# completed. Bytes per response (head included) come from wrk's "read" total.
#
# usage: scripts/compression-cpu-per-request.sh [length] [level] [connections] [seconds]
# needs: target/release/keymaster, wrk, nginx (apt-get install wrk nginx-light)
set -euo pipefail
LENGTH=${1:-10000}
LEVEL=${2:-6}
CONNS=${3:-20}
SECS=${4:-8}
URLPATH="/?length=$LENGTH&gzip=0"
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18281
TICK=$(getconf CLK_TCK)
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

taskset -c 1 "$KM" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port $STUB_PORT

run_one() { # name port pid accept-encoding
  local name=$1 port=$2 pid=$3 accept=$4
  wait_port "$port"
  local url="http://127.0.0.1:$port$URLPATH"
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s -H "Accept-Encoding: $accept" "$url" >/dev/null  # warm-up
  local enc; enc=$(curl -s -o /dev/null -D - -H "Accept-Encoding: $accept" "$url" | awk -F': ' 'tolower($1)=="content-encoding" {print $2}' | tr -d '\r')
  local before; before=$(cpu_ticks "$pid")
  local out; out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" -H "Accept-Encoding: $accept" "$url")
  local after; after=$(cpu_ticks "$pid")
  local reqs; reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  local read; read=$(echo "$out" | awk '/requests in/ {print $5}')
  local rps; rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  local errs; errs=$(echo "$out" | grep -E "Non-2xx|Socket errors" | tr '\n' ' ' || true)
  local us; us=$(awk -v t=$((after-before)) -v hz="$TICK" -v r="$reqs" 'BEGIN { printf "%.1f", t / hz * 1e6 / r }')
  local bytes; bytes=$(awk -v s="$read" -v r="$reqs" 'BEGIN {
    m = 1; if (s ~ /KB$/) m = 1024; if (s ~ /MB$/) m = 1048576; if (s ~ /GB$/) m = 1073741824;
    sub(/[KMG]?B$/, "", s); printf "%.0f", s * m / r }')
  printf "%-22s %-5s %9s req/s  cpu/req %7s us  bytes/resp %6s  %s\n" "$name" "${enc:--}" "$rps" "$us" "$bytes" "$errs"
}

# keymaster, one route (and one run) per case: `compression` is the route's table, or none.
km_run() { # name accept-encoding compression-table
  cat > "$WORK/keymaster.toml" <<KM
[server]
workers = 1
[admin]
listen = "off"
[[listeners]]
name = "main"
address = "127.0.0.1:18290"
[[routes]]
name = "bench"
cluster = "stub"
$3
[[clusters]]
name = "stub"
servers = [{ address = "127.0.0.1:$STUB_PORT" }]
KM
  taskset -c 0 "$KM" run --config "$WORK/keymaster.toml" >/dev/null 2>&1 & PIDS+=($!)
  run_one "$1" 18290 "${PIDS[-1]}" "$2"
  kill "${PIDS[-1]}"
  sleep 0.5
}

echo "length $LENGTH, gzip level $LEVEL, $CONNS connections, ${SECS}s per run"
km_run "keymaster gzip $LEVEL" gzip "compression = { algorithms = [\"gzip\"], gzip_level = $LEVEL }"
km_run "keymaster (none)" gzip ""
km_run "keymaster br 4" br "compression = { algorithms = [\"br\"], brotli_level = 4 }"
km_run "keymaster zstd 3" zstd "compression = { algorithms = [\"zstd\"], zstd_level = 3 }"

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
  gzip on;
  gzip_comp_level $LEVEL;
  gzip_min_length 1024;
  gzip_proxied any;
  gzip_vary on;
  gzip_types text/plain application/json;  # text/html is always on
  upstream origin { server 127.0.0.1:$STUB_PORT; keepalive 1024; }
  server {
    listen 127.0.0.1:18291 reuseport;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGX
taskset -c 0 nginx -c "$WORK/nginx.conf" & PIDS+=($!)
run_one "nginx gzip $LEVEL" 18291 "${PIDS[-1]}" gzip
kill "${PIDS[-1]}"
sleep 0.5
sed -i 's/gzip on;/gzip off;/' "$WORK/nginx.conf"
taskset -c 0 nginx -c "$WORK/nginx.conf" & PIDS+=($!)
run_one "nginx (none)" 18291 "${PIDS[-1]}" gzip
kill "${PIDS[-1]}"
