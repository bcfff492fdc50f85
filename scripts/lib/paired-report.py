"""Paired ratios of CPU per request, for the filter benchmark scripts.

Input lines: `<round>.<window> <config> <microseconds per request>`; the lines of one window
were measured together (next to each other in time, or at the same time), and the windows of
one round by the same gateway processes. Each config is compared with "none" (else the first
config seen) window by window: the median ratio, its interquartile range, the mean +- 2
standard errors, each round's median, and a 95% interval of the median from a bootstrap that
resamples whole rounds (windows of one round share the processes' memory layout and are not
independent). Seeded: the same input gives the same report.
"""
import random
import statistics as st
import sys

runs, order = {}, []
for line in open(sys.argv[1]):
    window, config, us = line.split()
    if config not in runs:
        order.append(config)
    runs.setdefault(config, {})[window] = float(us)
if "none" in order:
    order.remove("none")
    order.insert(0, "none")
title = sys.argv[2] if len(sys.argv) > 2 else "CPU per request"
base = runs[order[0]]
rounds = sorted({w.split(".")[0] for w in base}, key=int)
print("%s, %d windows in %d rounds:" % (title, len(base), len(rounds)))
rng = random.Random(1)
for c in order:
    r = runs[c]
    print("%-8s median %6.2f us (min %6.2f, max %6.2f)" % (
        c, st.median(r.values()), min(r.values()), max(r.values())))
    if c == order[0]:
        continue
    by_round = {k: [] for k in rounds}
    for w in r:
        if w in base:
            by_round[w.split(".")[0]].append(r[w] / base[w] - 1)
    ratios = sorted(x for v in by_round.values() for x in v)
    if len(ratios) < 2:  # a trial run: no spread to report
        print("  vs %s: %+5.1f%% (one window)" % (order[0], ratios[0] * 100))
        continue
    q = st.quantiles(ratios, n=4)
    se = st.stdev(ratios) / len(ratios) ** 0.5
    boot = sorted(
        st.median([x for k in rng.choices(rounds, k=len(rounds)) for x in by_round[k]])
        for _ in range(2000))
    # Two decimals for the median and its interval: a budget (3%) is judged on the top.
    print("  vs %s: median %+6.2f%% (95%% interval %+6.2f..%+6.2f%%), IQR %+5.1f..%+5.1f%%,"
          " mean %+5.1f%% +- %.1f" % (
              order[0], st.median(ratios) * 100, boot[50] * 100, boot[1949] * 100,
              q[0] * 100, q[2] * 100, st.mean(ratios) * 100, 2 * se * 100))
    print("  round medians: " + " ".join(
        "%+.1f%%" % (st.median(by_round[k]) * 100) for k in rounds if by_round[k]))
