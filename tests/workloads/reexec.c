/*
 * reexec: a CPU burner that becomes another program on request. It spends argv[1] seconds in
 * main -> reexec_outer -> reexec_hot; on SIGUSR1 it execs argv[2] (when given) with argv[1], so
 * the same process (same pid, same start time) runs a copy under another name. SIGTERM/SIGINT
 * end it.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile sig_atomic_t exec_requested;
static volatile uint64_t sink;

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

static void on_usr1(int sig) {
    (void)sig;
    exec_requested = 1;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void reexec_hot(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 6364136223846793005ull + 1442695040888963407ull + i;
    sink = acc;
}

__attribute__((noinline)) void reexec_outer(void) {
    reexec_hot();
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    signal(SIGUSR1, on_usr1);
    uint64_t end = monotonic_ns() + (uint64_t)(seconds * 1e9);
    while (!stop && monotonic_ns() < end) {
        reexec_outer();
        if (exec_requested && argc > 2) {
            char *args[] = {argv[2], argv[1], NULL};
            execv(argv[2], args);
            perror("reexec: execv");
            return 1;
        }
    }
    return 0;
}
