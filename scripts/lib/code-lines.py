"""Per-request cache figures and the code lines a config adds, from callgrind files written
with --cache-sim=yes --dump-instr=yes --compress-pos=no --compress-strings=no (see
scripts/filter-code-footprint.sh).

usage: code-lines.py DIR N1 N2 CONFIG...   (DIR/<config>.<n>.cg; the first config is the base)
"""
import collections
import sys


def load(path):
    """The summary totals (Ir, I1mr, D1mr), and the count of each executed instruction
    address with its function."""
    events, totals, addrs = [], None, {}
    fn, skip = None, False
    for line in open(path, errors="replace"):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            totals = dict(zip(events, map(int, line.split()[1:])))
        elif line.startswith("fn="):
            fn = line[3:].strip()
        elif line.startswith("calls="):
            skip = True  # the next cost line is the call's inclusive cost
        elif line.startswith("0x"):
            if skip:
                skip = False
                continue
            parts = line.split()
            a = int(parts[0], 16)
            ir = int(parts[2]) if len(parts) > 2 else 0
            entry = addrs.setdefault(a, [fn, 0])
            entry[1] += ir
    return totals, addrs


def main():
    d, n1, n2, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    per, lines = {}, {}
    for c in configs:
        (t1, _), (t2, addrs) = load(f"{d}/{c}.{n1}.cg"), load(f"{d}/{c}.{n2}.cg")
        per[c] = {e: (t2[e] - t1[e]) / (n2 - n1) for e in ("Ir", "I1mr", "D1mr")}
        # Lines of code run at least once per request of the N2 run.
        by_line = collections.defaultdict(set)
        for a, (f, n) in addrs.items():
            if n >= n2:
                by_line[a >> 6].add(f)
        lines[c] = by_line
    base = configs[0]
    print("per request: instructions, L1 instruction-cache misses, L1 data-cache read misses")
    for c in configs:
        p = per[c]
        delta = "" if c == base else "  (%+.0f, %+.1f, %+.1f over %s)" % (
            p["Ir"] - per[base]["Ir"], p["I1mr"] - per[base]["I1mr"],
            p["D1mr"] - per[base]["D1mr"], base)
        print("%-8s %8.0f %8.1f %7.1f%s" % (c, p["Ir"], p["I1mr"], p["D1mr"], delta))
    for c in configs[1:]:
        new = set(lines[c]) - set(lines[base])
        print("\n%s: %d lines of code per request (%s: %d), %d of them not run by %s" % (
            c, len(lines[c]), base, len(lines[base]), len(new), base))
        by_fn = collections.Counter(" | ".join(sorted(lines[c][x])) for x in new)
        for f, n in by_fn.most_common(15):
            print("%5d  %s" % (n, f[:140]))


main()
