#!/usr/bin/env bash
# The training run of scripts/build-pgo.sh: the instrumented keymaster as a one-route proxy
# (plain and TLS listeners, one worker) in front of its own stub, under its own load
# generator: HTTP/1.1 keep-alive with 1 KB, 10 KB and 100 KB bodies, a new connection per
# request, 1,600 connections at a fixed rate, HTTP/2 (h2c and over TLS), TLS keep-alive and
# handshakes. Only the proxy's profile is kept (the stub's and the generator's go to
# /dev/null). Every load must succeed.
#
# usage: PGO_DATA=DIR scripts/lib/pgo-train.sh KEYMASTER   (writes DIR/raw/*.profraw)
#        scripts/lib/pgo-train.sh KEYMASTER TOOLS   (BOLT's instrumented build: the stub and
#        the generator run as the binary TOOLS; the proxy writes the profile it was built to)
set -euo pipefail
KM=$1
TOOLS=${2:-$1}
DATA=${PGO_DATA:-}
STUB_PORT=18981
PORT=18990
TLS_PORT=18993
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

# The stub's and the generator's profiles are not kept (the variable on the command itself,
# so that `$!` is the stub's own pid for the cleanup).
LLVM_PROFILE_FILE=/dev/null "$TOOLS" stub --listen 127.0.0.1:$STUB_PORT --workers 1 >/dev/null 2>&1 &
PIDS+=($!)
wait_port $STUB_PORT

tls=()
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -addext "basicConstraints=critical,CA:FALSE" 2>/dev/null
  tls=(--tls-listen 127.0.0.1:$TLS_PORT --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem")
else
  echo "no openssl: training without TLS" >&2
fi
# The proxy's profile: LLVM's under PGO_DATA; a BOLT-instrumented binary writes its own.
LLVM_PROFILE_FILE="${DATA:+$DATA/raw/keymaster-%p.profraw}" "$KM" proxy --listen 127.0.0.1:$PORT \
  --to 127.0.0.1:$STUB_PORT --workers 1 "${tls[@]}" >/dev/null 2>&1 &
PROXY=$!
PIDS+=($PROXY)
wait_port $PORT

load() { # what -- load arguments
  local what=$1; shift 2
  echo "   $what"
  LLVM_PROFILE_FILE=/dev/null "$TOOLS" load -t 1 --warmup 0s "$@" >"$WORK/load.txt" 2>&1 || {
    echo "training load failed ($what):" >&2
    cat "$WORK/load.txt" >&2
    exit 1
  }
}
U=http://127.0.0.1:$PORT
load "1 KB, 50 connections" -- --url "$U/?length=1000" -c 50 -d 4s
load "10 KB" -- --url "$U/?length=10000" -c 50 -d 2s
load "100 KB" -- --url "$U/?length=100000" -c 16 -d 2s
load "a new connection per request" -- --url "$U/?length=1000" -c 16 -d 3s --churn
load "1,600 connections at 20,000 requests/s" -- --url "$U/?length=1000" -c 1600 -R 20000 -d 3s
load "HTTP/2" -- --url "$U/?length=1000" -c 16 -d 3s --h2
if [ ${#tls[@]} -gt 0 ]; then
  T=https://127.0.0.1:$TLS_PORT
  load "TLS" -- --url "$T/?length=1000" --ca "$WORK/cert.pem" -c 16 -d 2s
  load "TLS handshakes" -- --url "$T/?length=1000" --ca "$WORK/cert.pem" -c 8 -d 2s --churn
  load "HTTP/2 over TLS" -- --url "$T/?length=1000" --ca "$WORK/cert.pem" -c 16 -d 2s --h2
fi
# A graceful stop: the profile is written at exit.
kill -TERM "$PROXY"
wait "$PROXY" || { echo "the proxy did not stop cleanly (exit $?)" >&2; exit 1; }
[ -z "$DATA" ] || ls "$DATA"/raw/*.profraw >/dev/null
