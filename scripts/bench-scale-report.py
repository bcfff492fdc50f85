#!/usr/bin/env python3
"""Tables, a CSV and the workers-scaling chart from a many-core run (issue 26).

Reads what scripts/bench-16core-run.sh leaves in its folder: scale-w<N>/results.json
(saturation, and the 50 ms origin at some connections per worker, at N workers),
body-<SIZE>-w<N>, churn-w<N> and ramp-w<N>/results.json, loadavg.txt (`epoch load1 load5
load15 ...` every second) and steps.txt (`== NAME (epoch)` / `exit rc (epoch)` lines).

    scripts/bench-scale-report.py RUN_DIR OUT_DIR

writes OUT_DIR/tables.md, OUT_DIR/results.csv and OUT_DIR/workers-scaling.svg.
"""
import csv, glob, json, os, re, sys

run, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
SYSTEMS = ["keymaster", "nginx", "haproxy", "zuul2"]
COLORS = {"keymaster": "#d62728", "nginx": "#1f77b4", "haproxy": "#2ca02c", "zuul2": "#9467bd"}


def load_avg():
    pts = []
    try:
        for line in open(os.path.join(run, "loadavg.txt")):
            f = line.split()
            if len(f) >= 2:
                pts.append((int(f[0]), float(f[1])))
    except OSError:
        pass
    return pts


def windows():
    """[(label, start, end)] from steps.txt."""
    w, cur = [], None
    try:
        for line in open(os.path.join(run, "steps.txt")):
            m = re.search(r"\((\d+)\)", line)
            if not m:
                continue
            t = int(m.group(1))
            if line.startswith("=="):
                cur = (line.strip("= \n").split(" (")[0], t)
            elif cur:
                w.append((cur[0], cur[1], t))
                cur = None
    except OSError:
        pass
    return w


LA, WIN = load_avg(), windows()


def ldavg(start, end):
    """The 1-minute load average at the end of a window, and the highest within it."""
    inside = [v for t, v in LA if start <= t <= end]
    return (inside[-1], max(inside)) if inside else (None, None)


rows = []  # (kind, workers, connections, system, median dict, errors, scenario)
for path in sorted(glob.glob(os.path.join(run, "*-w*/results.json"))):
    kind = os.path.basename(os.path.dirname(path)).rsplit("-w", 1)[0]
    d = json.load(open(path))
    w = d["settings"]["workers"]
    for sc in d["scenarios"]:
        for st in sc["steps"]:
            rows.append((kind, w, st["connections"], st["system"], st["median"], st["errors"], sc["name"]))

with open(os.path.join(out, "results.csv"), "w", newline="") as f:
    keys = ["rps", "p50_ms", "p99_ms", "cpu_pct", "cpu_ms_per_1k", "rss_mib", "non_2xx", "socket_errors", "generator_cpu_pct"]
    wr = csv.writer(f)
    wr.writerow(["run", "scenario", "workers", "connections", "system"] + keys + ["errors"])
    for kind, w, c, s, m, e, sc in rows:
        wr.writerow([kind, sc, w, c, s] + [round(m[k], 3) if isinstance(m[k], float) else m[k] for k in keys] + [e])


def get(kind, w, c, s, scenario=None):
    for r in rows:
        if (r[0] == kind and r[1] == w and (c is None or r[2] == c) and r[3] == s
                and (scenario is None or r[6] == scenario)):
            return r
    return None


def fmt(x, nd=0):
    return "—" if x is None else f"{x:,.{nd}f}"


def window(name):
    """LdAvg (end, highest) over the phase `name` of steps.txt."""
    return next((ldavg(a, b) for lbl, a, b in WIN if lbl == name), (None, None))


md = []
present = [s for s in SYSTEMS if any(r[3] == s for r in rows)]


def step_table(label, keyed):
    """One row per (label value, {system: row}): req/s of each system, then keymaster
    beside nginx: CPU per request (and the ratio), p99, RSS; errors of any system."""
    shown = [s for s in present if any(r.get(s) for _, r in keyed)]
    md.append(f"| {label} | " + " | ".join(f"{s} req/s" for s in shown)
              + " | CPU ms/1k keymaster / nginx | p99 ms keymaster / nginx | RSS MiB keymaster / nginx | errors |")
    md.append("|--:|" + "--:|" * len(shown) + "--:|--:|--:|---|")
    for key, r in keyed:
        km, ng = r.get("keymaster"), r.get("nginx")
        ratio = km[4]["cpu_ms_per_1k"] / ng[4]["cpu_ms_per_1k"] if km and ng else None
        errs = ", ".join(f"{s}: {r[s][4]['non_2xx']:,} non-2xx, {r[s][4]['socket_errors']:,} socket"
                         for s in shown if r.get(s) and r[s][5]) or "none"
        md.append(f"| {key} | " + " | ".join(fmt(r[s][4]["rps"]) if r.get(s) else "—" for s in shown)
                  + f" | {fmt(km and km[4]['cpu_ms_per_1k'], 1)} / {fmt(ng and ng[4]['cpu_ms_per_1k'], 1)} (**{fmt(ratio, 2)}x**)"
                  + f" | {fmt(km and km[4]['p99_ms'], 1)} / {fmt(ng and ng[4]['p99_ms'], 1)}"
                  + f" | {fmt(km and km[4]['rss_mib'], 1)} / {fmt(ng and ng[4]['rss_mib'], 1)} | {errs} |")
    md.append("")


scale_ws = sorted({r[1] for r in rows if r[0] == "scale" and r[6] == "saturation"})
if scale_ws:
    md.append("### Workers scaling: saturation")
    md.append("")
    md.append("| workers | " + " | ".join(f"{s} req/s" for s in present) + " | "
              + " | ".join(f"{s} CPU ms/1k" for s in present)
              + " | keymaster / nginx (CPU) | p99 ms keymaster / nginx | LdAvg (1 min, end of phase) |")
    md.append("|--:|" + "--:|" * (2 * len(present) + 3))
    for w in scale_ws:
        r = {s: get("scale", w, None, s, "saturation") for s in present}
        km, ng = r.get("keymaster"), r.get("nginx")
        ratio = km[4]["cpu_ms_per_1k"] / ng[4]["cpu_ms_per_1k"] if km and ng else None
        la = window(f"scale-w{w}")[0]
        md.append(f"| {w} | " + " | ".join(fmt(r[s][4]["rps"]) if r[s] else "—" for s in present) + " | "
                  + " | ".join(fmt(r[s][4]["cpu_ms_per_1k"], 1) if r[s] else "—" for s in present)
                  + f" | **{fmt(ratio, 2)}x** | {fmt(km and km[4]['p99_ms'], 2)} / {fmt(ng and ng[4]['p99_ms'], 2)} | {fmt(la, 2)} |")
    md.append("")
per_worker = sorted({(r[1], r[2]) for r in rows if r[0] == "scale" and r[6] == "ramp"})
if per_worker:
    md.append("### Connections per worker: 50 ms origin")
    md.append("")
    step_table("workers (connections)", [(f"{w} ({c:,})", {s: get("scale", w, c, s, "ramp") for s in present})
                                         for w, c in per_worker])
def body_bytes(label):
    """`10KB` -> 10240 (the run's --body values), for ordering."""
    m = re.match(r"(\d+)\s*([KkMm]?)", label)
    return int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2).lower()] if m else 0


bodies = sorted({(r[0], r[1]) for r in rows if r[0].startswith("body-")}, key=lambda k: body_bytes(k[0][5:]))
if bodies:
    md.append("### Body sizes: saturation")
    md.append("")
    step_table("body (workers, connections)",
               [(f"{k[5:]} ({w}, {next(r[2] for r in rows if r[0] == k)})",
                 {s: get(k, w, None, s) for s in present}) for k, w in bodies])
churn = sorted({(r[0], r[1], r[2]) for r in rows if r[6] == "churn"}, key=lambda k: k[1:])
if churn:
    md.append("### Connection churn: a new connection per request, 1 KB")
    md.append("")
    step_table("workers (connections)", [(f"{w} ({c:,})", {s: get(k, w, c, s, "churn") for s in present})
                                         for k, w, c in churn])
ramp = sorted({(r[1], r[2]) for r in rows if r[0] == "ramp" and r[6] == "ramp"})
if ramp:
    w0 = ramp[0][0]
    md.append(f"### The ramp at {w0} workers: 1 KB, 50 ms origin")
    md.append("")
    step_table("connections", [(f"{c:,}", {s: get("ramp", w, c, s) for s in present}) for w, c in ramp])
    la = window(f"ramp-w{w0}")
    md.append(f"LdAvg (1 min) during the ramp: {fmt(la[1], 2)} at its highest, {fmt(la[0], 2)} at its end.")
open(os.path.join(out, "tables.md"), "w").write("\n".join(md) + "\n")

# The chart: req/s (left) and CPU ms per 1k requests (right) against workers, per system.
if scale_ws:
    W, H, pad = 860, 360, 60
    panels = [("requests/s", "rps", 1.0), ("CPU ms per 1,000 requests", "cpu_ms_per_1k", 1.0)]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    pw = (W - 3 * pad) / 2
    for i, (title, key, _) in enumerate(panels):
        x0 = pad + i * (pw + pad)
        y0, ph = 40, H - 100
        vals = [r[4][key] for r in rows if r[0] == "scale" and r[6] == "saturation"]
        ymax = max(vals) * 1.1 if vals else 1
        svg.append(f'<text x="{x0 + pw / 2}" y="22" text-anchor="middle" font-weight="bold">{title} against workers</text>')
        svg.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw}" y2="{y0 + ph}" stroke="black"/>')
        svg.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph}" stroke="black"/>')
        for k in range(5):
            v = ymax * k / 4
            y = y0 + ph - ph * k / 4
            svg.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + pw}" y2="{y}" stroke="#ddd"/>')
            lab = f"{v / 1000:.0f}k" if key == "rps" else f"{v:.0f}"
            svg.append(f'<text x="{x0 - 6}" y="{y + 4}" text-anchor="end">{lab}</text>')
        xs = {w: x0 + pw * (j + 0.5) / len(scale_ws) for j, w in enumerate(scale_ws)}
        for w, x in xs.items():
            svg.append(f'<text x="{x}" y="{y0 + ph + 18}" text-anchor="middle">{w}</text>')
        svg.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 36}" text-anchor="middle">workers</text>')
        for s in present:
            pts = [(xs[w], y0 + ph - ph * get("scale", w, None, s, "saturation")[4][key] / ymax) for w in scale_ws if get("scale", w, None, s, "saturation")]
            if pts:
                svg.append(f'<polyline fill="none" stroke="{COLORS[s]}" stroke-width="2" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
                svg += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{COLORS[s]}"/>' for x, y in pts]
    for j, s in enumerate(present):
        x = pad + j * 130
        svg.append(f'<rect x="{x}" y="{H - 22}" width="12" height="12" fill="{COLORS[s]}"/><text x="{x + 18}" y="{H - 12}">{s}</text>')
    svg.append("</svg>")
    open(os.path.join(out, "workers-scaling.svg"), "w").write("\n".join(svg) + "\n")
print(open(os.path.join(out, "tables.md")).read())
