#!/usr/bin/env python3
"""Asks the kernel for a short scheduler slice on a running process's threads.

    bench/proxy/slice.py PID SLICE_US

EEVDF (Linux 6.12 and later) takes a per-task slice for SCHED_OTHER from `sched_setattr`'s
`sched_runtime` (clamped to 0.1-100 ms): a task with a shorter slice than the one running gets
the CPU sooner when it wakes. compare.sh's `+slice` targets (e.g. `samewise+slice`) apply it to
the target's every thread once it is up, to measure what a latency hint on the proxy's threads
buys on a shared host (README, "Where the p99 comes from"). Prints each thread and the slice it
reads back; fails if the kernel refused any.
"""
import ctypes
import os
import struct
import sys

SYS_SCHED_SETATTR, SYS_SCHED_GETATTR = 314, 315  # x86_64
ATTR = "IIQiIQQQII"  # struct sched_attr, version 1: 56 bytes


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    pid, slice_ns = int(sys.argv[1]), int(float(sys.argv[2]) * 1000)
    libc = ctypes.CDLL(None, use_errno=True)
    failed = 0
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            comm = f.read().strip()
        attr = ctypes.create_string_buffer(struct.pack(ATTR, 56, 0, 0, 0, 0, slice_ns, 0, 0, 0, 0), 56)
        if libc.syscall(SYS_SCHED_SETATTR, int(tid), attr, 0) != 0:
            print(f"{tid} {comm}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
            failed += 1
            continue
        back = ctypes.create_string_buffer(56)
        libc.syscall(SYS_SCHED_GETATTR, int(tid), back, 56, 0)
        print(f"{tid} {comm}: slice {struct.unpack(ATTR, back.raw)[5] / 1000:g} us")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
