"""exec.py: a Python process that burns CPU in before_exec until told to exec, then replaces
itself with another program (os.execve), keeping its pid and start time: the profiler must stop
walking the old interpreter's frames in the new image (CPython 3.6 to 3.14).

Usage: exec.py PROGRAM [ARGS...]. Prints {"ready":true,"pid":N} at start and burns until
SIGUSR1 (or 10 minutes), then prints {"exec":PROGRAM} and execs PROGRAM ARGS (argv[0] =
PROGRAM) without PYTHONHOME in its environment (the tests set it for this interpreter; another
one has its own).
"""
import json
import os
import signal
import sys
import time

GO = []


def before_exec(deadline):
    acc = 0
    while not GO and time.time() < deadline:
        for i in range(2000):
            acc = (acc * 31 + i) & 0xFFFF
    return acc


signal.signal(signal.SIGUSR1, lambda signum, frame: GO.append(signum))
program = sys.argv[1]
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
before_exec(time.time() + 600)
print(json.dumps({"exec": program}), flush=True)
environment = dict(os.environ)
environment.pop("PYTHONHOME", None)
os.execve(program, sys.argv[1:], environment)
