#!/usr/bin/env python3
"""Where a proxy's latency tail comes from, read from `loadgen rate --trace` files
(compare.sh with TRACE=1 writes one per point: OUT/trace-TARGET-MODE-RATE-REPEAT.tsv).

For each file: the paired added latency (proxied minus direct, per tick) at p50 / p99, then
the ticks above the p99 (the tail) described by when they happened:
  - `bursts`: how many separate episodes they form (slow ticks less than 5 ms apart are one),
    and the largest; a tail of a few long episodes is a stall, one of many singletons is
    per-request noise;
  - `phase`: the densest 50 ms of the tail's times modulo PERIOD ms (default 1000, the record
    writer's flush interval), as a share of the tail (a tail of ~150 ticks without such a
    period puts about 10% in its densest 50 ms by chance; a period shows as far more);
  - `both_slow`: the share of the tail whose direct request was slow too (above its own p99):
    a stall of the whole host rather than of the proxy.

    bench/proxy/tail.py [--period MS] TRACE.tsv...
"""
import sys


def load(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            t, d, p = line.rstrip("\n").split("\t")
            if d and p:
                rows.append((float(t), int(d), int(p)))
    return rows


def q(sorted_v, f):
    return sorted_v[min(len(sorted_v) - 1, int(f * len(sorted_v)))]


def describe(path, period):
    rows = load(path)
    if len(rows) < 200:
        return f"{path}: {len(rows)} answered ticks, too few"
    paired = sorted(p - d for _, d, p in rows)
    p99 = q(paired, 0.99)
    d99 = q(sorted(d for _, d, _ in rows), 0.99)
    tail = [(t, d, p) for t, d, p in rows if p - d > p99]
    times = sorted(t for t, _, _ in tail)
    bursts, largest, run = 0, 0, 0
    last = None
    for t in times:
        if last is None or t - last >= 5.0:
            bursts += 1
            run = 0
        run += 1
        largest = max(largest, run)
        last = t
    bins = [0] * int(period // 50 or 1)
    for t in times:
        bins[int((t % period) // 50) % len(bins)] += 1
    both = sum(1 for _, d, _ in tail if d > d99)
    n = len(tail) or 1
    return (
        f"{path}: {len(rows)} ticks, paired added p50 {q(paired, 0.5) / 1000:.3f} ms, "
        f"p99 {p99 / 1000:.3f} ms; tail {len(tail)} ticks in {bursts} bursts (largest {largest}), "
        f"phase {100 * max(bins) / n:.0f}% in the densest 50 ms of {period:.0f}, "
        f"both_slow {100 * both / n:.0f}%"
    )


def main(argv):
    period = 1000.0
    if argv[:1] == ["--period"]:
        period = float(argv[1])
        argv = argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv:
        print(describe(path, period))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
