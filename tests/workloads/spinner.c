/*
 * spinner: a second, distinct CPU burner for the multi-process test. Its time goes to
 * main -> spin_outer -> spin_hot for argv[1] seconds (or until SIGTERM/SIGINT).
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
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

__attribute__((noinline)) void spin_hot(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void spin_outer(void) {
    spin_hot();
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
        spin_outer();
        rounds++;
    }
    printf("{\"rounds\":%llu}\n", (unsigned long long)rounds);
    fflush(stdout);
    return 0;
}
