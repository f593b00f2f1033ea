"""Formats the proxy benchmarks' results as Markdown tables.

Usage: python3 report.py RESULTS.jsonl [HOLD.json]      (bench/proxy/run.sh)
       python3 report.py compare OUT_DIR P99_LIMIT_MS   (bench/proxy/compare.sh)
"""

import json
import os
import statistics
import sys


def fmt(x, digits=3):
    return "n/a" if x is None else f"{x:.{digits}f}"


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []


def spread(values, digits=1):
    """median [min-max] of the values, or n/a"""
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}–{max(v):.{digits}f}]"


def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def compare(out, limit_ms) -> int:
    rows = load(f"{out}/cpu.jsonl")
    points = {}
    for r in rows:
        points.setdefault((r["target"], r.get("mode", "?"), r["rate_rps"]), []).append(r)
    paired = lambda rs, q: [(r.get("added_paired_ms") or {}).get(q) for r in rs]
    print("CPU per proxied request and paired added latency (median [min–max] over repeats):")
    print()
    print("| proxy | mode | rps | CPU µs / request | paired added p50 (ms) | paired added p99 (ms) "
          "| errors | late ticks | RSS after (MB) | load (1 min) | mock CPU µs / request |")
    print("|---|---|---:|---|---|---|---:|---:|---:|---|---:|")
    order = {"samewise": 0, "samewise-base": 0.5, "samewise-1w": 1, "relay": 2, "relay-http": 3, "relay-axum": 4, "litellm": 5}
    for (target, mode, rate), rs in sorted(points.items(), key=lambda kv: (order.get(kv[0][0], 6), kv[0][1], kv[0][2])):
        errors = sum(sum((r.get("errors") or {}).values()) for r in rs)
        print(f"| {target} | {mode} | {rate:.0f} | {spread([r['cpu_us_per_req'] for r in rs])} "
              f"| {spread(paired(rs, 'p50'), 2)} | {spread(paired(rs, 'p99'), 2)} | {errors} "
              f"| {sum(r.get('late_ticks', 0) for r in rs)} | {max(r['rss_kb'] for r in rs) / 1000:.1f} "
              f"| {min(r['load1'] for r in rs):.1f}–{max(r['load1'] for r in rs):.1f} "
              f"| {fmt(med([r.get('mock_cpu_us_per_req') for r in rs]), 1)} |")
    ratios = []
    for (target, mode, rate), rs in sorted(points.items()):
        if target != "litellm":
            continue
        for srate in sorted({k[2] for k in points if k[0] == "samewise" and k[1] == mode}):
            ss = points[("samewise", mode, srate)]
            cpu = med([r["cpu_us_per_req"] for r in rs]) / med([r["cpu_us_per_req"] for r in ss])
            lat = [med(paired(rs, q)) / med(paired(ss, q)) if srate == rate and med(paired(ss, q)) else None
                   for q in ("p50", "p99")]
            ratios.append(f"| {mode} | LiteLLM at {rate:.0f} rps / samewise at {srate:.0f} rps | {cpu:.0f}× "
                          f"| {'n/a' if lat[0] is None else f'{lat[0]:.0f}×'} / {'n/a' if lat[1] is None else f'{lat[1]:.0f}×'} |")
    # the floors (bench/proxy/compare.sh's `relay`, `relay-http` and `relay-axum` targets) and an
    # earlier build (`samewise-base`)
    floor, base = [], []
    for (target, mode, rate), rs in sorted(points.items()):
        ss = points.get(("samewise", mode, rate))
        if not (target.startswith("relay") or target == "samewise-base") or not ss:
            continue
        cpu = [med([r["cpu_us_per_req"] for r in x]) for x in (ss, rs)]
        p99 = [med(paired(x, "p99")) for x in (ss, rs)]
        (base if target == "samewise-base" else floor).append(
            f"| {target} | {mode} | {rate:.0f} | {fmt(cpu[0], 1)} / {fmt(cpu[1], 1)} = {cpu[0] / cpu[1]:.2f}× "
            f"| {fmt(p99[0], 2)} / {fmt(p99[1], 2)} |")
    if base:
        print()
        print("Against the earlier build (`samewise-base`, BASE), medians:")
        print()
        print("| earlier build | mode | rps | CPU µs / request, samewise / base | paired added p99 (ms), samewise / base |")
        print("|---|---|---:|---|---|")
        print("\n".join(base))
    if floor:
        print()
        print("Against the floors (`tcp-relay` on the same runtime: `relay` relays bytes, `relay-http` passes "
              "HTTP through hyper's server and client, `relay-axum` does the same as an axum handler under "
              "`axum::serve`; none routes, inspects or records), medians:")
        print()
        print("| floor | mode | rps | CPU µs / request, samewise / floor | paired added p99 (ms), samewise / floor |")
        print("|---|---|---:|---|---|")
        print("\n".join(floor))
    if ratios:
        print()
        print("| mode | ratio of medians | CPU per request | paired added p50 / p99 (same rate only) |")
        print("|---|---|---:|---|")
        print("\n".join(ratios))
    caps = load(f"{out}/capacity.jsonl")
    if caps:
        print()
        print(f"Capacity: the highest rate with paired added p99 ≤ {limit_ms} ms, 0 errors, 0 dropped records "
              "(each repeat steps the rate up until a step fails):")
        print()
        print("| proxy | mode | repeat | capacity (rps) | first failing step | why | CPU µs / request at capacity |")
        print("|---|---|---:|---:|---|---|---:|")
        for target, mode, rep in sorted({(r["target"], r.get("mode", "?"), r["repeat"]) for r in caps},
                                        key=lambda k: (order.get(k[0], 6), k[1], k[2])):
            steps = [r for r in caps if r["target"] == target and r.get("mode") == mode and r["repeat"] == rep]
            ok = [r for r in steps if ((r.get("added_paired_ms") or {}).get("p99") or 1e9) <= float(limit_ms)
                  and not r.get("errors") and not r.get("dropped")]
            bad = [r for r in steps if r not in ok]
            best = max(ok, key=lambda r: r["rate_rps"]) if ok else None
            why = "none failed"
            if bad:
                b = bad[0]
                why = (f"p99 {fmt((b.get('added_paired_ms') or {}).get('p99'), 2)} ms, "
                       f"{sum((b.get('errors') or {}).values())} errors, dropped {b.get('dropped')}")
            print(f"| {target} | {mode} | {rep} | {best['rate_rps'] if best else 0:.0f} "
                  f"| {bad[0]['rate_rps'] if bad else 'none':} | {why} "
                  f"| {fmt(best['cpu_us_per_req'], 1) if best else 'n/a'} |")
    return 0


def main() -> int:
    if sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3])
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    print("| mode | rate (rps) | sent rps | direct p50 / p99 (ms) | proxy p50 / p99 (ms) "
          "| added p50 / p99 (ms) | paired added p50 / p99 (ms) | errors | late ticks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d, p, a, ap = r["direct_ms"], r["proxy_ms"], r["added_ms"], r["added_paired_ms"]
        errors = sum(r["errors"].values())
        print(f"| {r['mode']} | {r['rate_rps']:.0f} | {r['achieved_rps']:.0f} "
              f"| {fmt(d['p50'])} / {fmt(d['p99'])} | {fmt(p['p50'])} / {fmt(p['p99'])} "
              f"| {fmt(a['p50'])} / {fmt(a['p99'])} | {fmt(ap['p50'])} / {fmt(ap['p99'])} "
              f"| {errors} | {r['late_ticks']} |")
        for what, n in r["errors"].items():
            print(f"|  | | | error: {what} x{n} | | | | | |")
    if len(sys.argv) > 2:
        h = json.load(open(sys.argv[2]))
        print()
        print(f"Open streams: {h['ready']} of {h['streams']} held open through the proxy; "
              f"proxy RSS before {h['rss_before_kb'] / 1024:.1f} MiB, "
              f"with the streams open {h['rss_open_kb'] / 1024:.1f} MiB, "
              f"peak (VmHWM) {h['hwm_kb'] / 1024:.1f} MiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
