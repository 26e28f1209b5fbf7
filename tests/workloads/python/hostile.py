"""hostile.py: a Python process that lies to a profiler walking its frames from outside
(CPython 3.6 to 3.14). Modes:

  cycle    the current frame's link to its caller (`f_back` of the frame object to 3.10, the
           interpreter frame's `previous` from 3.11) points at the frame itself: an endless chain
  wild     that link points at a buffer of this process whose every word points at the buffer
           itself: a fake frame whose code is no code object and whose caller is itself
  bigname  a function with a 1 MiB name, defined in a file with a 1 MiB name, burns the CPU

The link's offset is not assumed: it is found by looking, in the first words of the current
frame, for the caller's frame address (so a build whose layout differs fails loudly here, not
silently in the test). The broken link is restored before the function returns, so CPython
itself never follows it.

Usage: hostile.py MODE SECONDS. Prints {"ready":true,"pid":N,"mode":MODE} once the lie is in
place, {"done":true} at the end.
"""
import ctypes
import json
import os
import sys
import time

WORD = ctypes.sizeof(ctypes.c_void_p)


def word(address):
    return ctypes.c_size_t.from_address(address)


def frame_address(frame):
    """The address a walker follows for `frame`: the frame object to 3.10, its interpreter
    frame (`f_frame`, the word after `f_back` in PyFrameObject) from 3.11."""
    if sys.version_info >= (3, 11):
        return word(id(frame) + 3 * WORD).value
    return id(frame)


def link_offset(me, caller):
    """Offset in `me` of the word that holds `caller` (the link to the caller's frame)."""
    for offset in range(0, 16 * WORD, WORD):
        if word(me + offset).value == caller:
            return offset
    raise SystemExit("hostile.py: no link to the caller's frame in the first 16 words")


def burn(deadline):
    acc = 0
    while time.time() < deadline:
        for i in range(2000):
            acc = (acc * 31 + i) & 0xFFFF
    return acc


def lie_and_burn(mode, seconds):
    me = frame_address(sys._getframe(0))
    caller = frame_address(sys._getframe(1))
    offset = link_offset(me, caller)
    fake = None
    if mode == "cycle":
        target = me
    else:
        # 64 KiB of words that all point at the buffer itself.
        fake = (ctypes.c_size_t * 8192)()
        base = ctypes.addressof(fake)
        for i in range(8192):
            fake[i] = base
        target = base
    link = word(me + offset)
    link.value = target
    print(json.dumps({"ready": True, "pid": os.getpid(), "mode": mode}), flush=True)
    acc = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        for i in range(2000):
            acc = (acc * 31 + i) & 0xFFFF
    link.value = caller
    return acc


def big_name(seconds):
    name = "f" + "x" * (1 << 20)
    filename = "/" + "d" * (1 << 20) + ".py"
    source = "def %s(deadline, burn):\n    return burn(deadline) + burn(deadline)\n" % name
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    function = namespace[name]
    print(json.dumps({"ready": True, "pid": os.getpid(), "mode": "bigname"}), flush=True)
    function(time.time() + seconds, burn)


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode == "bigname":
        big_name(seconds)
    elif mode in ("cycle", "wild"):
        lie_and_burn(mode, seconds)
    else:
        raise SystemExit("hostile.py: unknown mode %r" % mode)
    print(json.dumps({"done": True}), flush=True)


main()
