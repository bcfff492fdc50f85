#!/usr/bin/env bash
# What tracing costs: CPU per proxied request and latency with tracing off, at 1% and at
# 100% sampling (spans exported to a real OpenTelemetry Collector), and at 100% with the
# collector stopped (every export fails), same machine, same run.
#
# keymaster runs one worker pinned to CPU 0; the stub origin, wrk and the collector share
# CPU 1. Keep-alive both sides, 1000-byte bodies. CPU per request = (utime + stime of the
# keymaster process, all threads) / requests completed; `export` is the part of it spent on
# the export thread (`keymaster-traces`), off the worker. Throughput here is bound by the
# load generator and the origin sharing one core: compare CPU per request.
#
# usage: scripts/trace-cost.sh [connections] [seconds]
# needs: target/release/keymaster, wrk, tools/otelcol/keymaster-otelcol (go build there)
set -euo pipefail
CONNS=${1:-50}
SECS=${2:-10}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
OTELCOL=${OTELCOL:-$(dirname "$0")/../tools/otelcol/keymaster-otelcol}
STUB_PORT=18281
TICK=$(getconf CLK_TCK)
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

taskset -c 1 "$KM" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port $STUB_PORT

cat > "$WORK/otelcol.yaml" <<YAML
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:18317
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [debug]
YAML
taskset -c 1 "$OTELCOL" --config "$WORK/otelcol.yaml" >/dev/null 2>&1 &
PIDS+=($!)
wait_port 18317

config() { # port [traces table]
  cat <<TOML
[server]
workers = 1
[admin]
listen = "127.0.0.1:0"
[[listeners]]
name = "main"
address = "127.0.0.1:$1"
$2
[[routes]]
name = "default"
cluster = "origin"
[[clusters]]
name = "origin"
servers = [{ address = "127.0.0.1:$STUB_PORT" }]
$3
TOML
}

run_one() { # name port config-file
  local name=$1 port=$2
  taskset -c 0 "$KM" run --config "$3" >/dev/null 2>&1 & local pid=$!
  PIDS+=($pid)
  wait_port "$port"
  taskset -c 1 wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port/?length=1000" >/dev/null  # warm-up
  local before; before=$(cpu_ticks "$pid")
  local xb; xb=$(export_ticks "$pid")
  local out; out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "http://127.0.0.1:$port/?length=1000")
  local after; after=$(cpu_ticks "$pid")
  local xa; xa=$(export_ticks "$pid")
  local reqs; reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  local rps; rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  local p50; p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  local p99; p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  local errs; errs=$(echo "$out" | grep -E "Non-2xx|Socket errors" | tr '\n' ' ' || true)
  local us; us=$(awk -v t=$((after-before)) -v hz="$TICK" -v r="$reqs" 'BEGIN { printf "%.2f", t / hz * 1e6 / r }')
  local xus; xus=$(awk -v t=$((xa-xb)) -v hz="$TICK" -v r="$reqs" 'BEGIN { printf "%.2f", t / hz * 1e6 / r }')
  printf "%-24s %10s req/s  p50 %8s  p99 %8s  cpu/req %6s us (export %5s)  %s\n" "$name" "$rps" "$p50" "$p99" "$us" "$xus" "$errs"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

# The export thread's ticks (0 when tracing is off).
export_ticks() {
  local t total=0
  for t in /proc/"$1"/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = "keymaster-trace" ] || continue
    total=$(( total + $(awk '{print $14 + $15}' "$t/stat") ))
  done
  echo "$total"
}

traces() { printf '[traces]\nendpoint = "http://127.0.0.1:%s"\n' "$1"; }

config 18290 "" "" > "$WORK/off.toml"
config 18291 "trace_sample = 0.01" "$(traces 18317)" > "$WORK/one.toml"
config 18292 "trace_sample = 1.0" "$(traces 18317)" > "$WORK/all.toml"
config 18293 "trace_sample = 1.0" "$(traces 18399)" > "$WORK/dead.toml"

for round in 1 2 3; do
  echo "round $round"
  run_one "tracing off" 18290 "$WORK/off.toml"
  run_one "sampled 1%" 18291 "$WORK/one.toml"
  run_one "sampled 100%" 18292 "$WORK/all.toml"
  run_one "100%, collector absent" 18293 "$WORK/dead.toml"
done
