"""Formats the proxy benchmark's results (bench/proxy/run.sh) as a Markdown table.

Usage: python3 report.py RESULTS.jsonl [HOLD.json]
"""

import json
import sys


def fmt(x, digits=3):
    return "n/a" if x is None else f"{x:.{digits}f}"


def main() -> int:
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
