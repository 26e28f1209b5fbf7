# Checks a CPython layout the relay computed against the running interpreter itself (CPython 3.6
# and later): run as `python -c "$(cat check.py)" key=value ...` with the layout's offsets, it
# reads this interpreter's own thread state, frames, code object and strings through ctypes at
# those offsets and prints one line per field: `ok NAME ...` or `MISMATCH NAME got=.. want=..`.
# A second source for every offset: the objects Python itself says they are (id(), sys._getframe,
# threading), not the headers the offsets came from.
import ctypes
import sys
import threading

args = dict(a.split("=", 1) for a in sys.argv[1:])


def opt(key):
    return int(args[key]) if key in args else None


def req(key):
    return int(args[key])


def ptr(addr):
    return ctypes.c_void_p.from_address(addr).value or 0


out = []


def check(name, got, want):
    verdict = "ok" if got == want else "MISMATCH"
    out.append("%s %s got=%s want=%s" % (verdict, name, got, want))


api = ctypes.pythonapi
api.PyThreadState_Get.restype = ctypes.c_void_p
libc = ctypes.CDLL(None)
libc.pthread_getspecific.restype = ctypes.c_void_p
libc.pthread_getspecific.argtypes = [ctypes.c_uint]


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def load_base():
    """Where the binary holding the interpreter is loaded (dladdr: no /proc needed, a chroot
    may have none): the start of its mapping of file offset 0."""
    info = DlInfo()
    libc.dladdr(ctypes.cast(api.Py_InitializeEx, ctypes.c_void_p), ctypes.byref(info))
    return info.dli_fbase


def inner():
    # No Python frame is pushed by these calls (C functions and ctypes type methods).
    tstate = api.PyThreadState_Get()
    me = sys._getframe()
    caller = sys._getframe(1)
    mask = ~req("frame.code_tag_mask")
    # Read inline: a call to a Python helper here would push its own frame first.
    frame = ctypes.c_void_p.from_address(tstate + req("thread.frame")).value
    if opt("thread.cframe_current_frame") is not None:
        frame = ctypes.c_void_p.from_address(frame + req("thread.cframe_current_frame")).value
    check("thread.frame -> frame.code", ptr(frame + req("frame.code")) & mask, id(me.f_code))
    prev = ptr(frame + req("frame.previous"))
    check("frame.previous", ptr(prev + req("frame.code")) & mask, id(caller.f_code))
    if args["frame.kind"] == "object":
        lasti = ctypes.c_int.from_address(prev + req("frame.instruction")).value
        if sys.version_info[:2] == (3, 10):
            lasti *= 2  # 3.10 counts code units, its f_lasti attribute bytes
        check("frame.instruction (f_lasti)", lasti, caller.f_lasti)
    else:
        ip = ptr(prev + req("frame.instruction"))
        start = id(caller.f_code) + req("code.code_adaptive")
        inside = start <= ip < start + len(caller.f_code.co_code)
        check("frame.instruction in caller's code", inside, True)
        check("frame.owner (thread)", ctypes.c_uint8.from_address(prev + req("frame.owner")).value, 0)
    if opt("frame.is_entry") is not None:
        # A Python-to-Python call runs in its caller's eval loop; the outermost frame started one.
        entry = req("frame.is_entry")
        check("frame.is_entry (inlined call)", ctypes.c_uint8.from_address(frame + entry).value, 0)
        bottom = frame
        for _ in range(1000):
            below = ptr(bottom + req("frame.previous"))
            if below == 0:
                break
            bottom = below
        check("frame.is_entry (outermost)", ctypes.c_uint8.from_address(bottom + entry).value, 1)

    interp = ptr(tstate + req("thread.interp"))
    check("thread.interp set", interp != 0, True)
    check("thread.thread_id", ctypes.c_ulong.from_address(tstate + req("thread.thread_id")).value,
          threading.get_ident())
    if opt("thread.native_thread_id") is not None:
        check("thread.native_thread_id",
              ctypes.c_ulong.from_address(tstate + req("thread.native_thread_id")).value,
              threading.get_native_id())
    t, found = ptr(interp + req("interpreter.threads_head")), False
    for _ in range(1000):
        if t == 0 or t == tstate:
            found = t == tstate
            break
        t = ptr(t + req("thread.next"))
    check("interpreter.threads_head / thread.next reach this thread", found, True)

    base = load_base()
    first = req("first_vaddr")
    if opt("anchors.runtime") is not None:
        runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        check("anchors.runtime", runtime - base, req("anchors.runtime") - first)
        check("runtime.interpreters_head", ptr(runtime + req("runtime.interpreters_head")), interp)
        if opt("runtime.tss_key") is not None:
            key = ctypes.c_uint.from_address(runtime + req("runtime.tss_key")).value
            check("runtime.tss_key", libc.pthread_getspecific(key) or 0, tstate)
        if opt("runtime.tstate_current") is not None:
            check("runtime.tstate_current", ptr(runtime + req("runtime.tstate_current")), tstate)
    if opt("anchors.thread_state_current") is not None:
        current = base + req("anchors.thread_state_current") - first
        check("anchors.thread_state_current", ptr(current), tstate)
    if opt("anchors.auto_tls_key") is not None:
        key = ctypes.c_int.from_address(base + req("anchors.auto_tls_key") - first).value
        check("anchors.auto_tls_key", libc.pthread_getspecific(key) or 0, tstate)
    if opt("anchors.code_type") is not None:
        check("anchors.code_type", base + req("anchors.code_type") - first, id(type(me.f_code)))
    if opt("anchors.interp_head") is not None:
        check("anchors.interp_head", ptr(base + req("anchors.interp_head") - first), interp)

    code = me.f_code
    check("code.filename", ptr(id(code) + req("code.filename")), id(code.co_filename))
    check("code.name", ptr(id(code) + req("code.name")), id(code.co_name))
    if opt("code.qualname") is not None:
        check("code.qualname", ptr(id(code) + req("code.qualname")), id(code.co_qualname))
    check("code.firstlineno", ctypes.c_int.from_address(id(code) + req("code.firstlineno")).value,
          code.co_firstlineno)
    table = code.co_linetable if sys.version_info >= (3, 10) else code.co_lnotab
    check("code.linetable", ptr(id(code) + req("code.linetable")), id(table))

    name = code.co_name
    check("unicode.length", ctypes.c_ssize_t.from_address(id(name) + req("unicode.length")).value,
          len(name))
    state = ctypes.c_uint32.from_address(id(name) + req("unicode.state")).value
    check("unicode.state compact ascii", (state >> 5) & 3, 3)
    check("unicode.ascii_size", ctypes.string_at(id(name) + req("unicode.ascii_size"), len(name)),
          name.encode())


def outer():
    inner()


outer()
print("\n".join(out))
