#!/usr/bin/env bash
# An origin's death under load, keymaster and nginx side by side: three `keymaster stub`
# origins behind one upstream (round robin), keep-alive clients sending GETs
# (`keymaster load`, closed loop), and one origin SIGKILLed and restarted on the same port
# KILLS times during the run. Prints the failed requests of each system (non-2xx/3xx answers
# plus requests without an answer) out of those completed.
#
# Systems: keymaster with the default route retry policy (one attempt), keymaster with
# `retry = { attempts = 3 }`, and nginx with its defaults (proxy_next_upstream error timeout,
# max_fails=1 fail_timeout=10s). keymaster has active health checks (every 200 ms) and outlier
# ejection after 3 failures; nginx OSS has no active checks. Everything runs on 127.0.0.1;
# one gateway worker (or nginx worker) each, one stub worker per origin.
#
# usage: scripts/origin-kill.sh [connections] [seconds] [delay_ms]
#   env KILLS (default 3): kills per run; DOWN (default 2): seconds each kill lasts
# needs: target/release/keymaster (cargo build --release), nginx (apt-get install nginx-light),
#        python3
set -euo pipefail
CONNS=${1:-64}
SECS=${2:-20}
DELAY=${3:-20}
KILLS=${KILLS:-3}
DOWN=${DOWN:-2}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUBS=(18281 18282 18283)
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# Our children by role, so that only live ones are stopped on exit (a killed origin's pid is
# reaped and forgotten, never signalled again).
STUB_PIDS=()
GW=""
LOAD=""
stop_all() {
  for p in "${STUB_PIDS[@]}" $GW $LOAD; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap stop_all EXIT

start_stub() { # index
  "$KM" stub --listen "127.0.0.1:${STUBS[$1]}" --workers 1 >/dev/null 2>&1 &
  STUB_PIDS[$1]=$!
  wait_port "${STUBS[$1]}"
}
stop_gateway() {
  kill "$GW"
  wait "$GW" 2>/dev/null || true
  GW=""
}
for i in 0 1 2; do start_stub "$i"; done

keymaster_config() { # port admin_port route_retry
  cat <<KMC
[server]
workers = 1

[admin]
listen = "127.0.0.1:$2"

[[listeners]]
name = "main"
address = "127.0.0.1:$1"

[[routes]]
name = "default"
cluster = "stubs"
$3

[[clusters]]
name = "stubs"
servers = [{ address = "127.0.0.1:${STUBS[0]}" }, { address = "127.0.0.1:${STUBS[1]}" }, { address = "127.0.0.1:${STUBS[2]}" }]
balance = "round_robin"
health_check = { path = "/", interval = "200ms", timeout = "1s", healthy_threshold = 2, unhealthy_threshold = 2 }
outlier_detection = { consecutive_failures = 3 }
KMC
}

cat > "$WORK/nginx.conf" <<NGX
worker_processes 1;
daemon off;
master_process off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log crit;
events { worker_connections 10240; }
http {
  access_log off;
  upstream stubs {
    server 127.0.0.1:${STUBS[0]}; server 127.0.0.1:${STUBS[1]}; server 127.0.0.1:${STUBS[2]};
    keepalive 1024;
  }
  server {
    listen 127.0.0.1:18291;
    location / { proxy_pass http://stubs; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGX

# Run the load against `port` while killing the third origin; print one result line.
run_one() { # name port
  local name=$1 port=$2
  wait_port "$port"
  "$KM" load --url "http://127.0.0.1:$port/?delay=$DELAY" -c "$CONNS" -d "${SECS}s" \
    --warmup 1s --json >"$WORK/load.json" 2>/dev/null &
  LOAD=$!
  local gap=$(( (SECS - KILLS * DOWN) / (KILLS + 1) ))
  sleep 1
  for _ in $(seq 1 "$KILLS"); do
    sleep "$gap"
    kill -KILL "${STUB_PIDS[2]}"
    wait "${STUB_PIDS[2]}" 2>/dev/null || true
    STUB_PIDS[2]=""
    sleep "$DOWN"
    start_stub 2
  done
  wait "$LOAD"
  LOAD=""
  python3 - "$name" "$WORK/load.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
e = r["errors"]
no_answer = sum(e.values())
failed = r["requests"] - r["ok"] + no_answer
print(f'{sys.argv[1]:<28} {failed:>6} failed of {r["requests"] + no_answer:>7}'
      f'  (5xx {r["status"]["s5xx"]}, no answer {no_answer})  {r["requests_per_sec"]:.0f} req/s')
PY
}

echo "$CONNS keep-alive clients, ${SECS}s, origin delay ${DELAY}ms, $KILLS kills of ${DOWN}s"
keymaster_config 18290 18299 "" >"$WORK/km-default.toml"
"$KM" run --config "$WORK/km-default.toml" >/dev/null 2>&1 &
GW=$!
run_one "keymaster (default policy)" 18290
stop_gateway
keymaster_config 18290 18299 'retry = { attempts = 3 }' >"$WORK/km-retry.toml"
"$KM" run --config "$WORK/km-retry.toml" >/dev/null 2>&1 &
GW=$!
run_one "keymaster (attempts = 3)" 18290
stop_gateway
if command -v nginx >/dev/null; then
  nginx -c "$WORK/nginx.conf" &
  GW=$!
  run_one "nginx (defaults)" 18291
  stop_gateway
else
  echo "nginx                        not installed: skipped"
fi
