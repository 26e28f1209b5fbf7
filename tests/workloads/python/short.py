"""short.py: a short-lived Python process (50-80 ms of CPU in all, start-up included), started
many times in a row (CPython 3.6 to 3.14).

    <module> -> short_burn

Usage: short.py MILLISECONDS. Burns in short_burn until the process has used MILLISECONDS of
CPU since it started (time.process_time), then prints {"cpu_ms":X} and exits.
"""
import json
import sys
import time


def short_burn(limit):
    acc = 0
    while time.process_time() < limit:
        for i in range(500):
            acc = (acc * 31 + i) & 0xFFFF
    return acc


short_burn(float(sys.argv[1]) / 1000.0)
print(json.dumps({"cpu_ms": round(time.process_time() * 1000.0, 3)}), flush=True)
