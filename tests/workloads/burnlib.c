/*
 * burnlib: a shared library for the unwind-eviction test, built three times with -DLIB=1/2/3:
 * `burn(rounds)` -> libN_outer -> libN_inner (names distinct per build), frame pointers kept,
 * plus about 30,000 tiny assembler functions whose CFI makes the library's unwind table large
 * (3 rows each), so a few such tables fill a small --unwind-memory-bytes.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 *        -shared -fPIC -fno-toplevel-reorder -DLIB=N
 */
#include <stdint.h>

#ifndef LIB
#error "build with -DLIB=1, 2 or 3"
#endif
#ifndef PAD
#define PAD 3000
#endif

#define CAT3(a, b, c) a##b##c
#define NAME(n, s) CAT3(lib, n, s)
#define STR2(x) #x
#define STR(x) STR2(x)

/* Never called: only their .eh_frame entries matter. `count` functions of 3 + LIB nops each
 * (5 rows each). With -fno-toplevel-reorder the text is: LIB * 10 of them, the library's real
 * functions, then PAD * 10 + LIB more, so the real functions sit at different addresses and
 * table rows in each library: one library's rows read for another's addresses give wrong
 * frames (the eviction test's deliberate bug). */
#define PADS(count)                                                                            \
    __asm__(".text\n"                                                                          \
            ".rept " count "\n"                                                                \
            ".cfi_startproc\n"                                                                 \
            "push %rbp\n"                                                                      \
            ".cfi_def_cfa_offset 16\n"                                                         \
            ".rept " STR(LIB) "\nnop\n.endr\n"                                                 \
            ".cfi_offset %rbp, -16\n"                                                          \
            "mov %rsp, %rbp\n"                                                                 \
            ".cfi_def_cfa_register %rbp\n"                                                     \
            "pop %rbp\n"                                                                       \
            ".cfi_def_cfa %rsp, 8\n"                                                           \
            "ret\n"                                                                            \
            ".cfi_endproc\n"                                                                   \
            ".endr\n")

PADS(STR(LIB) "0");

static volatile uint64_t sink;

__attribute__((noinline)) void NAME(LIB, _inner)(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 100000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void NAME(LIB, _outer)(void) {
    NAME(LIB, _inner)();
    sink++;
}

/* Runs the chain `rounds` times: a fixed amount of CPU work. */
__attribute__((noinline)) void burn(uint64_t rounds) {
    for (uint64_t r = 0; r < rounds; r++)
        NAME(LIB, _outer)();
}


PADS(STR(PAD) STR(LIB));
