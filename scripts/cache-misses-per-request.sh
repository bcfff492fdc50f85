#!/usr/bin/env bash
# Cache misses per proxied request, by the number of client connections: keymaster vs nginx.
# Callgrind's cache simulation, with its two levels set to a core's own caches (a 48 KiB
# first level and a 2 MiB second level, where the real last level is shared and larger), so
# "L2 misses" counts what a request has to fetch from beyond its core's caches. The counts do
# not depend on machine load.
#
# The driver holds CONNS keep-alive connections open and goes round them in BATCH-sized
# groups (a request on each connection of the group, then the answers), so every connection
# sits idle while all the others are served, as under load at a fixed rate. Each system runs
# twice (R1 and R2 rounds); the difference removes start-up and the connections' opening.
#
# usage: scripts/cache-misses-per-request.sh [CONNS] [R1] [R2]
# env:   BATCH (64), LENGTH (1000), KM (target/release/keymaster), OUT (keep callgrind files)
# needs: valgrind, python3, target/release/keymaster; nginx optional
set -euo pipefail
CONNS=${1:-1600}
R1=${2:-1}
R2=${3:-3}
KM=${KM:-$(dirname "$0")/../target/release/keymaster}
STUB_PORT=18281
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true # CONNS sockets on each side
# shellcheck source=lib/callgrind-common.sh
. "$(dirname "$0")/lib/callgrind-common.sh"
CACHES=(--cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 --LL=2097152,16,64)

rounds() { # port rounds
  python3 - "$1" "$2" "$CONNS" "${BATCH:-64}" "${LENGTH:-1000}" <<'PY'
import socket, sys
port, rounds, conns, batch, length = (int(a) for a in sys.argv[1:6])
request = f"GET /?length={length} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]

def answer(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    lengths = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
    want = int(lengths[0].split(b":")[1])
    while len(body) < want:
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        body += chunk
    assert len(body) == want == length, (len(body), want)

for _ in range(rounds):
    for start in range(0, conns, batch):
        group = socks[start:start + batch]
        for s in group:
            s.sendall(request)
        for s in group:
            answer(s)
for s in socks:
    s.close()
PY
}

measure() { # name port rounds -- command...; prints the callgrind totals line
  local name=$1 port=$2 count=$3; shift 4
  local out="${OUT:-$WORK}/$name.$CONNS.$count.callgrind"
  valgrind --tool=callgrind "${CACHES[@]}" --callgrind-out-file="$out" "$@" \
    >"$WORK/$name.log" 2>&1 &
  local vpid=$!
  wait_port "$port"
  rounds "$port" "$count"
  kill -TERM "$vpid"; wait "$vpid" 2>/dev/null || true
  # "events: NAMES" and "summary: COUNTS" (trailing zero counts may be left off).
  awk '/^events:/ {e = $0} /^summary:/ {s = $0} END {print e; print s}' "$out"
}

report() { # name port -- command...
  local name=$1 port=$2; shift 3
  local a b
  a=$(measure "$name" "$port" "$R1" -- "$@")
  b=$(measure "$name" "$port" "$R2" -- "$@")
  python3 - "$name" "$(( (R2 - R1) * CONNS ))" "$a" "$b" <<'PY'
import sys
name, n = sys.argv[1], int(sys.argv[2])

def counts(totals):
    events, summary = (line.split()[1:] for line in totals.splitlines())
    return {e: int(c) for e, c in zip(events, summary + ["0"] * len(events))}

a, b = counts(sys.argv[3]), counts(sys.argv[4])
delta = {e: (b[e] - a[e]) / n for e in a}
code, data = delta["I1mr"], delta["D1mr"] + delta["D1mw"]
l2 = delta["ILmr"] + delta["DLmr"] + delta["DLmw"]
print(f"{name:10} {delta['Ir']:8.0f} instructions  {code + data:6.0f} L1 misses "
      f"({code:.0f} code, {data:.0f} data)  {l2:6.1f} L2 misses a request")
PY
}

echo "$CONNS connections, $(( (R2 - R1) * CONNS )) requests measured"
report keymaster 18290 -- "$KM" proxy --listen 127.0.0.1:18290 --to 127.0.0.1:$STUB_PORT --workers 1

if command -v nginx >/dev/null; then
  write_nginx_conf 18291
  report nginx 18291 -- nginx -c "$WORK/nginx.conf"
fi
