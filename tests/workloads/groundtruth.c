/*
 * groundtruth: a single-threaded CPU burner with a known self-time split over a nested call
 * chain, for checking a sampling profiler against the truth.
 *
 *   main -> outer_work -> middle_work -> inner_work
 *
 * Every call cycle (~1 ms) each function burns a chunk of arithmetic in its own body (about
 * 20% / 30% / 50% of the cycle) before calling the next one. Chunk lengths are jittered (+-75%)
 * so that the cycle cannot alias with a sampling period.
 *
 * The program measures the truth itself: after its chunk each function reads
 * CLOCK_THREAD_CPUTIME_ID and adds the time since the previous reading to its own total, so the
 * three totals partition the thread's CPU time (three clock calls per cycle cost well under 1% of
 * it). At exit (after argv[1] seconds, or on SIGTERM/SIGINT) it prints one JSON line with each
 * function's share of the three functions' total self time, e.g.
 *
 *   {"outer_work":0.2012,"middle_work":0.2988,"inner_work":0.5000,"cycles":12000,"cpu_s":11.98}
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { OUTER, MIDDLE, INNER, NFUNCS };

static volatile sig_atomic_t stop;
static volatile uint64_t sink;
static uint64_t self_ns[NFUNCS];
static uint64_t last_ns;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
/* Iterations of the busy loop per microsecond, measured at start-up. */
static uint64_t iters_per_us = 100;

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Charges the CPU time since the previous reading to `func`. */
static __attribute__((noinline)) void charge(int func) {
    uint64_t now = thread_cpu_ns();
    self_ns[func] += now - last_ns;
    last_ns = now;
}

/* Iterations for a chunk of `us` microseconds on average, uniformly jittered by +-75%, so that
 * the phase of the cycle at one sample tells little about its phase at the next. */
static uint64_t chunk(uint64_t us) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    uint64_t base = us * iters_per_us;
    return base / 4 + rng % (base * 3 / 2 + 1);
}

/* The busy loop is written out in each function so that its samples have that function as leaf. */
#define BURN(n)                                   \
    do {                                          \
        volatile uint64_t acc = sink;             \
        for (uint64_t i = (n); i > 0; i--)        \
            acc = acc * 6364136223846793005ull + i; \
        sink = acc;                               \
    } while (0)

__attribute__((noinline)) void inner_work(void) {
    BURN(chunk(500));
    charge(INNER);
}

__attribute__((noinline)) void middle_work(void) {
    BURN(chunk(300));
    charge(MIDDLE);
    inner_work();
}

__attribute__((noinline)) void outer_work(void) {
    BURN(chunk(200));
    charge(OUTER);
    middle_work();
}

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void calibrate(void) {
    uint64_t n = 1000000;
    for (;;) {
        uint64_t t0 = thread_cpu_ns();
        BURN(n);
        uint64_t dt = thread_cpu_ns() - t0;
        if (dt >= 20000000ull) { /* 20 ms */
            iters_per_us = n * 1000 / dt;
            if (iters_per_us == 0)
                iters_per_us = 1;
            return;
        }
        n *= 2;
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    calibrate();
    uint64_t deadline = monotonic_ns() + (uint64_t)(seconds * 1e9);
    uint64_t cycles = 0;
    last_ns = thread_cpu_ns();
    while (!stop && monotonic_ns() < deadline) {
        outer_work();
        cycles++;
    }

    double total = (double)(self_ns[OUTER] + self_ns[MIDDLE] + self_ns[INNER]);
    if (total <= 0)
        total = 1;
    printf("{\"outer_work\":%.4f,\"middle_work\":%.4f,\"inner_work\":%.4f,"
           "\"cycles\":%llu,\"cpu_s\":%.3f}\n",
           self_ns[OUTER] / total, self_ns[MIDDLE] / total, self_ns[INNER] / total,
           (unsigned long long)cycles, total / 1e9);
    fflush(stdout);
    return 0;
}
