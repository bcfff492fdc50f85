#!/usr/bin/env python3
"""Soak: keymaster under a fixed request rate for a long time, with a hot reload every
RELOAD seconds and an origin restart every RESTART seconds. Samples the gateway's RSS, open
descriptors and upstream pool sizes, fits a line to each and reports the slope per hour
(flat is the goal), and counts every request that did not get a 2xx.

usage: scripts/soak.py [--minutes 30] [--rate 500] [--out DIR] [--km target/release/keymaster]

Everything runs on 127.0.0.1: two `keymaster stub` origins, the gateway (2 workers, one
route with a GET retry policy, health checks, outlier detection), and `keymaster load` in
open-loop mode. Every process it starts is stopped by PID at the end. The report goes to
DIR/report.md and the samples to DIR/samples.csv.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

STUB_PORTS = (19181, 19182)
GW_PORT, ADMIN_PORT = 19180, 19190

CONFIG = """
[server]
workers = 2
drain_timeout = "5s"

[admin]
listen = "127.0.0.1:{admin}"

[[listeners]]
name = "main"
address = "127.0.0.1:{gw}"

[[routes]]
name = "soak"
cluster = "origins"
retry = {{ attempts = 3 }}
response_headers = {{ set = {{ "x-soak-generation" = "{generation}" }} }}

[[clusters]]
name = "origins"
servers = [{{ address = "127.0.0.1:{s0}" }}, {{ address = "127.0.0.1:{s1}" }}]
connect_timeout = "1s"
response_header_timeout = "5s"
health_check = {{ path = "/?length=1", interval = "1s", timeout = "500ms" }}
outlier_detection = {{ consecutive_failures = 3 }}
"""


def write_config(path, generation):
    text = CONFIG.format(admin=ADMIN_PORT, gw=GW_PORT, s0=STUB_PORTS[0], s1=STUB_PORTS[1],
                         generation=generation)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def wait_port(port, limit=10.0):
    import socket
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {limit}s")


def start_stub(km, port):
    p = subprocess.Popen([km, "stub", "--listen", f"127.0.0.1:{port}", "--workers", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return p


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=2) as r:
        text = r.read().decode()
    return {
        "rss_kib": rss,
        "fds": fds,
        "pool_open": metric_sum(text, "keymaster_upstream_connections"),
        "pool_idle": metric_sum(text, "keymaster_upstream_idle_connections"),
        "reloads_ok": metric_sum(text, "keymaster_config_reloads_total"),
    }


def slope_per_hour(ts, ys):
    n = len(ts)
    if n < 2:
        return 0.0
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    cov = sum((t - mt) * (y - my) for t, y in zip(ts, ys))
    return cov / var * 3600 if var else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--reload", type=float, default=30, help="seconds between reloads")
    ap.add_argument("--restart", type=float, default=300, help="seconds between origin restarts")
    ap.add_argument("--sample", type=float, default=10, help="seconds between samples")
    ap.add_argument("--out", default="soak-results")
    ap.add_argument("--km", default="target/release/keymaster")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="keymaster-soak-")
    cfg = os.path.join(work, "keymaster.toml")
    write_config(cfg, 0)
    procs = []
    try:
        stubs = [start_stub(a.km, p) for p in STUB_PORTS]
        procs += stubs
        gw = subprocess.Popen([a.km, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(work, "gateway.log"), "w"))
        procs.append(gw)
        wait_port(GW_PORT)
        secs = int(a.minutes * 60)
        load = subprocess.Popen(
            [a.km, "load", "--url", f"http://127.0.0.1:{GW_PORT}/?length=1000&delay=5",
             "-R", str(a.rate), "-c", "64", "-d", f"{secs}s", "--warmup", "1s", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(load)
        t0 = time.time()
        next_reload, next_restart, next_sample = t0 + a.reload, t0 + a.restart, t0
        rows, reloads, restarts = [], 0, 0
        while load.poll() is None:
            now = time.time()
            if now >= next_sample:
                rows.append({"t": round(now - t0, 1), **sample(gw.pid)})
                next_sample += a.sample
            if now >= next_reload:
                reloads += 1
                write_config(cfg, reloads)
                gw.send_signal(signal.SIGHUP)
                next_reload += a.reload
            if now >= next_restart:
                i = restarts % len(stubs)
                stubs[i].kill()
                stubs[i].wait()
                time.sleep(1)
                stubs[i] = start_stub(a.km, STUB_PORTS[i])
                procs.append(stubs[i])
                restarts += 1
                next_restart += a.restart
            time.sleep(0.2)
        report = json.loads(load.stdout.read())
        rows.append({"t": round(time.time() - t0, 1), **sample(gw.pid)})
        write_report(a, report, rows, reloads, restarts)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def write_report(a, report, rows, reloads, restarts):
    keys = ["rss_kib", "fds", "pool_open", "pool_idle", "reloads_ok"]
    with open(os.path.join(a.out, "samples.csv"), "w") as f:
        f.write("t," + ",".join(keys) + "\n")
        for r in rows:
            f.write(f"{r['t']}," + ",".join(str(r[k]) for k in keys) + "\n")
    # The first minute is warm-up for pools and allocator: fit the slope after it.
    settled = [r for r in rows if r["t"] >= 60] or rows
    ts = [r["t"] for r in settled]
    errors = sum(report["errors"].values())
    failed = report["requests"] - report["ok"] + errors
    lines = [
        "# Soak",
        "",
        f"{a.minutes:g} minutes at {a.rate} req/s (open loop, 64 connections, 1000-byte bodies,"
        f" 5 ms origin delay); a hot reload every {a.reload:g} s ({reloads} in all), an origin"
        f" killed and restarted every {a.restart:g} s ({restarts} in all). Gateway: 2 workers,"
        " route retry policy `attempts = 3`, health checks, outlier detection.",
        "",
        f"- requests: {report['requests']}, 2xx: {report['ok']}, failed (non-2xx or error):"
        f" **{failed}**; errors {report['errors']}; unsent {report.get('unsent', 0)}",
        f"- latency ms: p50 {report['latency_ms'].get('p50')}, p99 {report['latency_ms'].get('p99')},"
        f" max {report['latency_ms'].get('max')}",
        "",
        "| series | first | last | min | max | slope per hour (after the first minute) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for k in ["rss_kib", "fds", "pool_open", "pool_idle"]:
        ys = [r[k] for r in settled]
        lines.append(f"| {k} | {rows[0][k]:g} | {rows[-1][k]:g} | {min(ys):g} | {max(ys):g} |"
                     f" {slope_per_hour(ts, ys):+.1f} |")
    lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
