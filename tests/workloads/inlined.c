/*
 * inlined: a CPU burner whose hot loop lives in an always_inline function, for checking that
 * DWARF inlined-subroutine frames are named. Its time goes to
 *
 *   main -> calls_inlined -> [inlined] hot_inlined
 *
 * for argv[1] seconds (or until SIGTERM/SIGINT). Built with -O2 -g on top of the usual flags:
 * -fno-inline still inlines always_inline functions, so `hot_inlined` has no code of its own and
 * exists only in .debug_info (DW_TAG_inlined_subroutine inside `calls_inlined`).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile sig_atomic_t stop;
static volatile uint64_t sink;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline __attribute__((always_inline)) void hot_inlined(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void calls_inlined(void) {
    hot_inlined();
    /* Keeps the call a call (no tail position to fold away). */
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    uint64_t deadline = monotonic_ns() + (uint64_t)(seconds * 1e9);
    uint64_t rounds = 0;
    while (!stop && monotonic_ns() < deadline) {
        calls_inlined();
        rounds++;
    }
    printf("{\"rounds\":%llu}\n", (unsigned long long)rounds);
    fflush(stdout);
    return 0;
}
