#!/usr/bin/env bash
# Proves the built Zuul peers proxy: each (bench/peers/zuul1, bench/peers/zuul2) is started in
# front of a stub origin as `keymaster bench --peer` would start it, then answers a GET (1,000
# bytes), 200 GETs on one keep-alive connection, a POST whose body the origin echoes back
# byte for byte, and, once the origin is gone, a 5xx status instead of a hang or a reset.
# Run by .ci/run after scripts/build-zuul1.sh and scripts/build-zuul2.sh.
#
# usage: scripts/check-zuul-peers.sh        needs: target/{release,debug}/keymaster or KM=
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KM=${KM:-$(ls "$ROOT"/target/release/keymaster "$ROOT"/target/debug/keymaster 2>/dev/null | head -1)}
[ -x "$KM" ] || { echo "no keymaster binary (build it, or set KM=)" >&2; exit 1; }
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

# A port nothing listens on now (the peers take a port number, not 0).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

check() { # name port
  python3 - "$1" "$2" <<'PY'
import http.client, sys
name, port = sys.argv[1], int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request("GET", "/?length=1000")
r = c.getresponse(); body = r.read()
assert r.status == 200 and len(body) == 1000, (name, r.status, len(body))
for _ in range(200):
    c.request("GET", "/?length=100")
    r = c.getresponse(); assert r.status == 200 and len(r.read()) == 100, name
payload = bytes(range(256)) * 40
c.request("POST", "/?echo=1", body=payload)
r = c.getresponse(); echoed = r.read()
assert r.status == 200 and echoed == payload, (name, r.status, len(echoed))
print(f"{name}: a GET, 200 keep-alive GETs and an echoed POST proxied")
PY
}

for peer in zuul1 zuul2; do
  D="$ROOT/bench/peers/$peer"
  [ -f "$D/target/$peer-peer.jar" ] || { echo "$peer is not built: scripts/build-$peer.sh" >&2; exit 1; }
  STUB=$(free_port); PORT=$(free_port)
  "$KM" stub --listen 127.0.0.1:$STUB --workers 1 >/dev/null 2>&1 & stub=$!; PIDS+=($stub)
  java -Xms64m -Xmx256m -cp "$D/target/$peer-peer.jar:$D/target/lib/*" "keymaster.$peer.Main" \
    $PORT 127.0.0.1:$STUB 1 >"$WORK/$peer.log" 2>&1 & PIDS+=($!)
  wait_port $STUB && wait_port $PORT || { cat "$WORK/$peer.log"; exit 1; }
  check $peer $PORT || { cat "$WORK/$peer.log"; exit 1; }
  kill $stub; wait $stub 2>/dev/null || true
  status=$(curl -s -o /dev/null -m 30 -w '%{http_code}' "http://127.0.0.1:$PORT/?length=10" || true)
  case $status in 5??) echo "$peer: $status once the origin is gone" ;;
    *) echo "$peer answered $status with its origin gone (want 5xx)" >&2; cat "$WORK/$peer.log"; exit 1 ;;
  esac
done
