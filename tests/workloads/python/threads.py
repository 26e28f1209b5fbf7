"""threads.py: two threads, each burning CPU in its own function (hot_a, hot_b), for checking
that a Python frame is filed under the thread that ran it (CPython 3.6 to 3.14).

Usage: threads.py SECONDS. Prints, once both threads run,
{"ready":true,"pid":N,"tids":{"hot_a":TID,"hot_b":TID},"lines":{"hot_a":L,"hot_b":L}} with
each thread's kernel thread id and each function's first line, then exits after SECONDS.
"""
import json
import os
import sys
import threading
import time


def native_id():
    """The kernel's id of the calling thread (threading.get_native_id is 3.8 on)."""
    if hasattr(threading, "get_native_id"):
        return threading.get_native_id()
    import ctypes

    return ctypes.CDLL(None, use_errno=True).syscall(186)  # SYS_gettid on x86-64


TIDS = {}
READY = threading.Event()


def hot_a(deadline):
    TIDS["hot_a"] = native_id()
    acc = 0
    while time.time() < deadline:
        for i in range(2000):
            acc = (acc * 31 + i) & 0xFFFF
    return acc


def hot_b(deadline):
    TIDS["hot_b"] = native_id()
    acc = 0
    while time.time() < deadline:
        for i in range(2000):
            acc = (acc * 17 + i) & 0xFFFF
    return acc


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
deadline = time.time() + seconds
threads = [threading.Thread(target=f, args=(deadline,)) for f in (hot_a, hot_b)]
for t in threads:
    t.start()
while len(TIDS) < 2:
    time.sleep(0.01)
lines = {f.__name__: f.__code__.co_firstlineno for f in (hot_a, hot_b)}
print(json.dumps({"ready": True, "pid": os.getpid(), "tids": TIDS, "lines": lines}), flush=True)
for t in threads:
    t.join()
