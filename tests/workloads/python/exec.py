"""exec.py: a Python process that burns CPU in before_exec for a while, then replaces itself
with another program (os.execv), keeping its pid: the profiler must stop walking the old
interpreter's frames in the new image (CPython 3.6 to 3.14).

Usage: exec.py SECONDS PROGRAM [ARGS...]. Prints {"ready":true,"pid":N} at start, burns for
SECONDS, then prints {"exec":PROGRAM} and execs PROGRAM ARGS (argv[0] = PROGRAM) without
PYTHONHOME in its environment (the tests set it for this interpreter; another one has its own).
"""
import json
import os
import sys
import time


def before_exec(deadline):
    acc = 0
    while time.time() < deadline:
        for i in range(2000):
            acc = (acc * 31 + i) & 0xFFFF
    return acc


seconds = float(sys.argv[1])
program = sys.argv[2]
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
before_exec(time.time() + seconds)
print(json.dumps({"exec": program}), flush=True)
environment = dict(os.environ)
environment.pop("PYTHONHOME", None)
os.execve(program, sys.argv[2:], environment)
