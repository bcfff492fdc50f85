#!/usr/bin/env python3
"""Resident memory per idle keep-alive connection: a one-worker `keymaster proxy` in front
of `keymaster stub`; after a warm-up (200 connections, two requests each, closed), open N
connections, send two 1,000-byte requests on each, and divide the growth of the proxy's
VmRSS by N. Ports 18381 (stub) and 18390 (proxy) must be free.

usage: scripts/idle-connection-memory.py [KM] [N]   (KM: target/release/keymaster, N: 4000)
"""
import os
import resource
import signal
import socket
import subprocess
import sys
import time

STUB, PROXY = 18381, 18390
REQUEST = b"GET /?length=1000 HTTP/1.1\r\nHost: bench\r\n\r\n"


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmRSS")


def one_request(sock):
    sock.sendall(REQUEST)
    data = b""
    while len(data.partition(b"\r\n\r\n")[2]) < 1000:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("the proxy closed a connection")
        data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"not a 200: {data[:80]!r}")


def connections(n):
    socks = [socket.create_connection(("127.0.0.1", PROXY)) for _ in range(n)]
    for _ in range(2):
        for s in socks:
            one_request(s)
    return socks


def main():
    default = os.path.join(os.path.dirname(__file__), "..", "target", "release", "keymaster")
    km = sys.argv[1] if len(sys.argv) > 1 else default
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    resource.setrlimit(resource.RLIMIT_NOFILE, (n * 3 + 1000, n * 3 + 1000))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    listen = lambda port: ["--listen", f"127.0.0.1:{port}", "--workers", "1"]
    stub = subprocess.Popen([km, "stub", *listen(STUB)], **quiet)
    proxy = subprocess.Popen([km, "proxy", *listen(PROXY), "--to", f"127.0.0.1:{STUB}"], **quiet)
    try:
        wait_port(STUB)
        wait_port(PROXY)
        for s in connections(200):
            s.close()
        time.sleep(0.5)
        before = rss(proxy.pid)
        socks = connections(n)
        time.sleep(0.5)
        after = rss(proxy.pid)
        print(
            f"{(after - before) / n:.0f} B per idle connection "
            f"({n} connections, RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB)"
        )
        for s in socks:
            s.close()
    finally:
        for p in (proxy, stub):
            p.send_signal(signal.SIGTERM)
            p.wait()


if __name__ == "__main__":
    main()
