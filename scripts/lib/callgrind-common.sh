# Shared by the callgrind scripts (on top of common.sh: temp dir, cleanup, port wait): the
# keep-alive (or, with CHURN=1, connection-per-request; with H2=1, HTTP/2) driver of
# LENGTH-byte responses (1000 unless set), one stub origin on $STUB_PORT, and the config of
# an nginx in front of it. Source after setting KM and STUB_PORT.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LOAD=${LOAD:-$KM} # the HTTP/2 driver: keymaster's load generator

drive() { # port count; CHURN=1: a new connection per request (`Connection: close`)
  if [ "${H2:-0}" = 1 ]; then
    # One h2c connection (prior knowledge), one stream at a time: keymaster's generator.
    "$LOAD" load --url "http://127.0.0.1:$1/?length=${LENGTH:-1000}" --h2 -c 1 -t 1 \
      --warmup 0s --requests "$2" --json >"$WORK/drive.json"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(r["ok"] < int(sys.argv[2]))' \
      "$WORK/drive.json" "$2" || { echo "the HTTP/2 driver failed: $(cat "$WORK/drive.json")" >&2; return 1; }
    return
  fi
  python3 - "$1" "$2" "${CHURN:-0}" "${LENGTH:-1000}" <<'PY'
import http.client, sys
port, n, churn, length = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
headers = {"Connection": "close"} if churn else {}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for _ in range(n):
    c.request("GET", f"/?length={length}", headers=headers)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200 and len(body) == length, (r.status, len(body))
    if churn:
        c.close()
c.close()
PY
}

"$KM" stub --listen 127.0.0.1:"$STUB_PORT" --workers 1 >/dev/null 2>&1 & PIDS+=($!)
wait_port "$STUB_PORT"

# $WORK/nginx.conf: one nginx process (no master, no daemon) on PORT, proxying to the stub
# with upstream keep-alive, access log off; room for 10,000 connections (its descriptor limit
# is the shell's); no limit on the requests a connection, client's or origin's, may carry
# (nginx closes one after 1,000 by default), as `keymaster bench` configures it. The
# scripts subtract two run lengths, so the table's start-up cost drops out.
write_nginx_conf() { # port
  cat > "$WORK/nginx.conf" <<NGX
worker_processes 1;
daemon off;
master_process off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 10000; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:$STUB_PORT; keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$1;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGX
}
