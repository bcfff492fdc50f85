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
for build in release debug; do
  [ -z "${KM:-}" ] && [ -x "$ROOT/target/$build/keymaster" ] && KM="$ROOT/target/$build/keymaster"
done
[ -x "${KM:-}" ] || { echo "no keymaster binary (build it, or set KM=)" >&2; exit 1; }
# shellcheck source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"

# Two ports nothing listens on now, told apart (the peers take a port number, not 0). The
# sockets are closed before the ports are printed: a port still held by a Python that has
# not exited yet is "in use" to whoever binds it next.
free_ports() {
  python3 -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in socks]
for s in socks:
    s.close()
print(*ports)'
}

check() { # name port
  python3 - "$1" "$2" <<'PY'
import http.client, sys
name, port = sys.argv[1], int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request("GET", "/?length=1000")
r = c.getresponse(); body = r.read()
assert r.status == 200 and len(body) == 1000, (name, r.status, len(body))
# http.client reconnects by itself after a close: the same local port proves keep-alive.
local = c.sock.getsockname()
for _ in range(200):
    c.request("GET", "/?length=100")
    r = c.getresponse()
    assert r.status == 200 and len(r.read()) == 100 and not r.will_close, name
    assert c.sock.getsockname() == local, (name, "a new connection", local)
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
  read -r STUB PORT <<<"$(free_ports)"
  "$KM" stub --listen 127.0.0.1:$STUB --workers 1 >"$WORK/stub.log" 2>&1 & stub=$!; PIDS+=($stub)
  # As the bench starts them: Zuul 2 with its event loops (one), Zuul 1 with its own threads.
  workers=(); [ $peer = zuul2 ] && workers=(1)
  java -Xms64m -Xmx256m -cp "$D/target/$peer-peer.jar:$D/target/lib/*" "keymaster.$peer.Main" \
    $PORT 127.0.0.1:$STUB "${workers[@]}" >"$WORK/$peer.log" 2>&1 & java=$!; PIDS+=($java)
  wait_port $STUB && wait_port $PORT || { cat "$WORK/stub.log" "$WORK/$peer.log"; exit 1; }
  check $peer $PORT || { cat "$WORK/$peer.log"; exit 1; }
  kill $stub 2>/dev/null || true; wait $stub 2>/dev/null || true
  status=$(curl -s -o /dev/null -m 30 -w '%{http_code}' "http://127.0.0.1:$PORT/?length=10" || true)
  case $status in 5??) echo "$peer: $status once the origin is gone" ;;
    *) echo "$peer answered $status with its origin gone (want 5xx)" >&2; cat "$WORK/$peer.log"; exit 1 ;;
  esac
  kill $java 2>/dev/null || true; wait $java 2>/dev/null || true
done
