# Prints, for every code object compiled from a source, what the relay's line decoder
# (lines.rs) must reproduce, as this interpreter itself computes it (CPython 3.6 and later):
# run as `python3 - [FILE] < lines.py`. Without FILE it compiles a generated source meant to
# exercise every corner of the line-table formats (long functions, line jumps of hundreds of
# lines either way, lines beyond 65535, long single-line expressions, wide columns,
# multi-line expressions, exception handlers, nested code, each release's newer syntax).
#
# First `version M.N.P`, then one tab-separated line per code object:
#   code NAME FIRSTLINENO TABLE RAW BY_TABLE BY_ADDR2LINE BY_POSITIONS
# TABLE: the hex of the whole line table (`co_lnotab` to 3.9, `co_linetable` from 3.10).
# RAW: the hex of the line-table bytes object's memory as the kernel copies it (from its start,
# header included, up to the end of its data and trailing NUL, at most 256 bytes).
# BY_TABLE: for every code unit (offset 0, 2, 4, ... of co_code), comma-separated, the line
# `dis.findlinestarts` (3.6-3.9) or `co_lines()` (3.10 on) gives it, `-` for none.
# BY_ADDR2LINE: the same from the C API `PyCode_Addr2Line(code, offset)` (`-` for -1).
# BY_POSITIONS: the same from `co_positions()` (the start line of each code unit's position:
# 3.11 on; empty before).
import ctypes
import sys
import types

if sys.version_info < (3, 10):
    import dis

KERNEL_COPY = 256

api = ctypes.pythonapi
api.PyCode_Addr2Line.restype = ctypes.c_int
api.PyCode_Addr2Line.argtypes = [ctypes.py_object, ctypes.c_int]


def generated_source():
    out = []
    add = out.append
    add("import os")
    add("def small(a):")
    add("    b = a + 1")
    add("    return b * 2")
    add("")
    # Many statements, one per line: a table far longer than the kernel's copy.
    add("def long_function(a):")
    for i in range(300):
        add("    a = a + %d" % i)
        if i % 37 == 0:
            # A gap of hundreds of lines: line deltas beyond one byte either encoding.
            out.extend(["    # gap"] * (130 + i))
    add("    return a")
    add("")
    # A long line: more bytecode than one byte-offset step, and columns beyond 127.
    add("def wide(a):")
    add("    x = [" + ", ".join("a" for _ in range(200)) + "]")
    add("    y = " + " + ".join("a.real" for _ in range(60)))
    add("    return x, y")
    add("")
    # Expressions spanning lines: the instruction's line jumps back (negative deltas).
    add("def multiline(a, b):")
    add("    r = os.path.join(")
    add("        str(a),")
    add("        str(")
    add("            b),")
    add("    )")
    add("    s = (a")
    add("         + b")
    add("         * a)")
    add("    return r, s")
    add("")
    add("def handlers(a):")
    add("    try:")
    add("        a = 1 / a")
    add("    except ZeroDivisionError as e:")
    add("        a = str(e)")
    add("    except (TypeError, ValueError):")
    add("        pass")
    add("    else:")
    add("        a = -a")
    add("    finally:")
    add("        a = (a, 1)")
    add("    with open(os.devnull) as f, open(os.devnull) as g:")
    add("        a = (a, f, g)")
    add("    for i in range(3):")
    add("        if i == 1:")
    add("            continue")
    add("        while i:")
    add("            i -= 1")
    add("            if i > 5:")
    add("                break")
    add("        else:")
    add("            a = (a, i)")
    add("    return a")
    add("")
    add("def nested(a):")
    add("    f = lambda x: x + a")
    add("    g = [x * a for x in range(a) if x]")
    add("    h = {x: y for x, y in zip(range(a), range(a))}")
    add("    def inner(z):")
    add("        nonlocal a")
    add("        a += z")
    add("        return a")
    add("    return f, g, h, inner")
    add("")
    add("class Klass:")
    add("    attr = 1")
    add("    @staticmethod")
    add("    def method(a):")
    add("        return a")
    add("")
    add("def generator(a):")
    add("    yield a")
    add("    yield from range(a)")
    add("")
    add("async def coroutine(a):")
    add("    await a")
    add("    async with a as b:")
    add("        async for c in b:")
    add("            return c")
    add("")
    add("def dead(a):")
    add("    return a")
    add("    a = a + 1")
    add("")
    if sys.version_info >= (3, 8):
        add("def walrus(a):")
        add("    if (n := len(a)) > 3:")
        add("        return n")
        add("")
    if sys.version_info >= (3, 10):
        add("def matching(a):")
        add("    match a:")
        add("        case [x, y, *rest]:")
        add("            return x")
        add("        case {'k': v}:")
        add("            return v")
        add("        case Klass(attr=1) | None:")
        add("            return 0")
        add("        case _:")
        add("            return -1")
        add("")
    if sys.version_info >= (3, 11):
        add("def groups(a):")
        add("    try:")
        add("        raise ExceptionGroup('g', [ValueError(a)])")
        add("    except* ValueError as e:")
        add("        a = e")
        add("    return a")
        add("")
    if sys.version_info >= (3, 12):
        add("def typed[T](a: T) -> T:")
        add("    return f'{a!r:>{10}} {f\"{a}\"}'")
        add("")
    # Far down the file: line numbers beyond 16 bits.
    out.extend([""] * (70000 - len(out)))
    add("def far(a):")
    add("    b = a")
    add("    return b")
    add("")
    return "\n".join(out) + "\n"


def codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for c in codes(const):
                yield c


def table_of(code):
    return code.co_lnotab if sys.version_info < (3, 10) else code.co_linetable


def by_table(code):
    """Line of every code unit, as the interpreter's Python-level API says."""
    units = len(code.co_code) // 2
    lines = [None] * units
    if sys.version_info < (3, 10):
        starts = sorted(dis.findlinestarts(code))
        line = None
        k = 0
        for unit in range(units):
            while k < len(starts) and starts[k][0] <= unit * 2:
                line = starts[k][1]
                k += 1
            lines[unit] = line
    else:
        for start, end, line in code.co_lines():
            for unit in range(start // 2, min(end // 2, units)):
                lines[unit] = line
    return lines


def by_addr2line(code):
    out = []
    for unit in range(len(code.co_code) // 2):
        line = api.PyCode_Addr2Line(code, unit * 2)
        out.append(None if line < 0 else line)
    return out


def by_positions(code):
    if sys.version_info < (3, 11):
        return []
    return [position[0] for position in code.co_positions()]


def show(lines):
    return ",".join("-" if x is None else str(x) for x in lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1]:
        path = sys.argv[1]
        with open(path) as f:
            source = f.read()
    else:
        path = "<generated>"
        source = generated_source()
    module = compile(source, path, "exec")
    print("version\t%d.%d.%d" % sys.version_info[:3])
    for code in codes(module):
        table = table_of(code)
        # From the object's start through its data and trailing NUL, as far as the kernel copies.
        size = min(KERNEL_COPY, sys.getsizeof(table))
        raw = ctypes.string_at(id(table), size)
        print(
            "\t".join(
                [
                    "code",
                    getattr(code, "co_qualname", code.co_name),
                    str(code.co_firstlineno),
                    table.hex(),
                    raw.hex(),
                    show(by_table(code)),
                    show(by_addr2line(code)),
                    show(by_positions(code)),
                ]
            )
        )


main()
