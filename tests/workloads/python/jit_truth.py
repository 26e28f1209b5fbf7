"""jit_truth.py: truth.py's split for CPython's perf trampolines (`-X perf_jit`, 3.13 on), for
checking JIT frames named from the jitdump file against the truth.

    <module> -> outer -> alpha   (about 30% of the cycle)
                      -> beta    (about 70%)

With `-X perf_jit`, CPython gives every Python function a trampoline, a few bytes of anonymous
executable code each call of it goes through, and writes one record naming it (`py::alpha:FILE`)
to /tmp/jit-PID.dump, which it maps executable. It writes that file through a 4 KiB stdio buffer:
the records of the functions called first last stay in the buffer, out of a profiler's sight,
until more records follow (or the process exits). So a warm-up calls outer once, then 64 new
functions (a trampoline each, about 230 bytes of records) push alpha's and beta's records into
the file before the measured loop starts.

The truth is measured, not assumed: alpha and beta each add the thread CPU time of their own
busy loop to their total. Usage: jit_truth.py SECONDS. Prints {"ready":true,"pid":N} once warmed
up, and at the end (after SECONDS of wall time, or on SIGTERM) one JSON line with each function's
share of the two totals, e.g. {"alpha":0.3012,"beta":0.6988,"cycles":9000}.
"""
import json
import os
import random
import signal
import sys
import time

CLOCK = time.thread_time
TOTALS = {"alpha": 0.0, "beta": 0.0}
STOP = []


def alpha(n):
    start = CLOCK()
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    TOTALS["alpha"] += CLOCK() - start
    return acc


def beta(n):
    start = CLOCK()
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    TOTALS["beta"] += CLOCK() - start
    return acc


def outer(unit, rng):
    alpha(int(3 * unit * (0.25 + 1.5 * rng.random())))
    beta(int(7 * unit * (0.25 + 1.5 * rng.random())))


def calibrate():
    """Iterations of the busy loop in about 100 us of CPU."""
    n = 20000
    start = CLOCK()
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
    spent = max(CLOCK() - start, 1e-6)
    return max(1, int(n * 100e-6 / spent))


def push_out_jitdump_records():
    for i in range(64):
        name = f"filler_{i}"
        space = {}
        exec(f"def {name}():\n    return {i}\n", space)
        space[name]()


signal.signal(signal.SIGTERM, lambda signum, frame: STOP.append(signum))
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
unit = calibrate()
rng = random.Random(0x5EED)
outer(unit, rng)
push_out_jitdump_records()
TOTALS = {"alpha": 0.0, "beta": 0.0}
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
deadline = time.time() + seconds
cycles = 0
while not STOP and time.time() < deadline:
    outer(unit, rng)
    cycles += 1
total = max(TOTALS["alpha"] + TOTALS["beta"], 1e-9)
print(
    json.dumps(
        {
            "alpha": round(TOTALS["alpha"] / total, 4),
            "beta": round(TOTALS["beta"] / total, 4),
            "cycles": cycles,
        }
    ),
    flush=True,
)
