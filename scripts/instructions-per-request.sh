#!/usr/bin/env bash
# User-space instructions per proxied request under callgrind: keymaster vs nginx vs HAProxy.
# Instruction counts do not depend on machine load, so this comparison is repeatable on a
# busy 2-core box. Each system runs twice under valgrind (N1 and N2 keep-alive requests on
# one client connection, 1000-byte bodies); (I(N2) - I(N1)) / (N2 - N1) removes start-up
# and shutdown costs.
#
# LENGTH=N asks for N-byte bodies instead of 1000.
# CHURN=1 opens a new connection per request (`Connection: close`): the user-space cost of a
# connection's accept, set-up, one request and close.
# H2=1 sends the requests as HTTP/2 streams on one h2c connection (keymaster's generator);
# every system still speaks HTTP/1.1 to the origin.
#
# usage: [CHURN=1 | H2=1] [LENGTH=N] scripts/instructions-per-request.sh [N1] [N2]
# needs: valgrind, python3, target/release/keymaster; nginx and haproxy optional
set -euo pipefail
N1=${1:-300}
N2=${2:-1300}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18181
# shellcheck source=lib/callgrind-common.sh
. "$(dirname "$0")/lib/callgrind-common.sh"

# run NAME PORT COUNT -- command...
measure() {
  local name=$1 port=$2 count=$3; shift 4
  local out="$WORK/$name.$count.log"
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" >"$out" 2>&1 &
  local vpid=$!
  wait_port "$port"
  local driven=0
  drive "$port" "$count" || driven=$?
  kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
  # A failed driver fails the run: no figure from a run whose requests did not all complete.
  [ "$driven" = 0 ] || return 1
  grep -h "Collected" "$out" | awk '{s += $NF} END {print s}'
}

report() { # name port -- cmd
  local name=$1 port=$2; shift 3
  local a b
  a=$(measure "$name" "$port" "$N1" -- "$@") || { echo "$name: the run of $N1 failed" >&2; exit 1; }
  b=$(measure "$name" "$port" "$N2" -- "$@") || { echo "$name: the run of $N2 failed" >&2; exit 1; }
  awk -v n="$name" -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
    'BEGIN { printf "%-10s %8.0f instructions/request\n", n, (b - a) / (n2 - n1) }'
}

report keymaster 18190 -- "$KM" proxy --listen 127.0.0.1:18190 --to 127.0.0.1:$STUB_PORT --workers 1

if command -v nginx >/dev/null; then
  write_nginx_conf 18191
  if [ "${H2:-0}" = 1 ]; then
    sed -i 's|listen 127.0.0.1:18191;|listen 127.0.0.1:18191 http2;|' "$WORK/nginx.conf"
  fi
  report nginx 18191 -- nginx -c "$WORK/nginx.conf"
  # The same with keymaster's default header duties (as `keymaster bench --peer-headers
  # duties` configures it): Host kept, X-Forwarded-*, Via both ways, a request id both ways.
  duties='proxy_set_header Host $http_host; proxy_set_header X-Forwarded-For $remote_addr;'
  duties+=' proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $http_host;'
  duties+=' proxy_set_header Via "1.1 nginx"; proxy_set_header X-Request-Id $request_id;'
  duties+=' add_header Via "1.1 nginx" always; add_header X-Request-Id $request_id always;'
  sed -e "s|proxy_set_header Connection \"\"; }|proxy_set_header Connection \"\"; $duties }|" \
    -e "s|18191|18193|; s|nginx.pid|nginx-duties.pid|" "$WORK/nginx.conf" >"$WORK/nginx-duties.conf"
  report nginx-duties 18193 -- nginx -c "$WORK/nginx-duties.conf"
fi

if command -v haproxy >/dev/null; then
  cat > "$WORK/haproxy.cfg" <<HAP
global
  nbthread 1
  maxconn 1000
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:18192 $([ "${H2:-0}" = 1 ] && echo "proto h2")
  default_backend be
backend be
  server s1 127.0.0.1:$STUB_PORT
HAP
  report haproxy 18192 -- haproxy -f "$WORK/haproxy.cfg" -db
fi
