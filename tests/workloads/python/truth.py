"""truth.py: a pure-Python CPU burner with a known split, for checking Python frames in a
profile against the truth (CPython 3.6 to 3.14, no imports beyond the standard library).

    <module> -> outer -> alpha   (about 30% of the cycle)
                      -> beta    (about 70%)

The loop runs at module level, so the Python chain of every sample in the busy loops is exactly
`<module>`, `outer`, then `alpha` or `beta`. Each cycle (about 1 ms) burns a chunk in alpha's
body, then one in beta's; chunk lengths are jittered (+-75%) so that the cycle cannot alias with
a sampling period. The names are plain module-level functions: `co_name` (to 3.10) and
`co_qualname` (3.11 on) are the same.

The truth is measured, not assumed: alpha and beta each add the thread CPU time of their own
busy loop (time.thread_time, 3.7 on; time.process_time on 3.6, the same for one thread) to
their total. Usage: truth.py SECONDS. Prints {"ready":true,"pid":N} at start, and at the end
(after SECONDS of wall time, or on SIGTERM) one JSON line with each function's share of the two
totals, e.g. {"alpha":0.3012,"beta":0.6988,"cycles":9000,"cpu_s":2.98}.

`truth.py SECONDS --flush-jitdump` is for CPython's perf trampolines (`-X perf_jit`, 3.13 on):
CPython gives every Python function a trampoline, a few bytes of anonymous executable code
each call goes through, and writes one record naming it (`py::alpha:FILE`) to
/tmp/jit-PID.dump, which it maps executable, through a 4 KiB stdio buffer: the records of the
functions called first stay in the buffer, out of a profiler's sight, until more follow. So
before printing ready it calls outer once, then 64 new functions (about 230 bytes of records)
push alpha's and beta's records into the file.
"""
import json
import os
import random
import signal
import sys
import time

CLOCK = getattr(time, "thread_time", time.process_time)
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


def flush_jitdump(unit, rng):
    """Calls outer once, then 64 new functions whose trampoline records push the first
    records out of CPython's buffer into the jitdump file."""
    outer(unit, rng)
    for i in range(64):
        name = "filler_%d" % i
        space = {}
        exec("def %s():\n    return %d\n" % (name, i), space)
        space[name]()
    for function in TOTALS:
        TOTALS[function] = 0.0


signal.signal(signal.SIGTERM, lambda signum, frame: STOP.append(signum))
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
warm_up = "--flush-jitdump" in sys.argv[2:]
if not warm_up:
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
unit = calibrate()
rng = random.Random(0x5EED)
if warm_up:
    flush_jitdump(unit, rng)
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
            "cpu_s": round(time.process_time(), 3),
        }
    ),
    flush=True,
)
