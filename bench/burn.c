/*
 * burn: the CPU-bound workload of bench/overhead.sh. Runs one busy thread per CPU (or argv[1]
 * threads) until SIGTERM/SIGINT. Each thread spends its time in a nested call chain
 *
 *   main/worker -> burn_round -> chain_a -> chain_b -> ... -> chain_h -> leaf_{mix,hash,sum}
 *
 * descending a varying number of extra recursive levels (depth_walk), so stacks are deep-ish
 * (roughly 12-20 user frames) and there are a few dozen distinct ones, like a real service.
 *
 * Every 100 ms the main thread prints "<CLOCK_MONOTONIC ns> <total rounds> <process CPU ns>" to
 * stdout, so the caller can compute the workload's throughput over any window, both per wall second
 * and per CPU second the workload got (the latter is insensitive to other load on the machine, but
 * includes what profilers make the kernel do in the workload's context: sampling interrupts, BPF).
 *
 * Build: gcc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256

static volatile sig_atomic_t stop;

/* One counter per thread, each on its own cache line. */
struct counter {
    volatile uint64_t rounds;
    char pad[64 - sizeof(uint64_t)];
};
static struct counter counters[MAX_THREADS];
static volatile uint64_t sink;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Leaves: where almost all the time goes. Each round is a fixed amount of work. */
__attribute__((noinline)) uint64_t leaf_mix(uint64_t x) {
    for (int i = 0; i < 20000; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
}

__attribute__((noinline)) uint64_t leaf_hash(uint64_t x) {
    for (int i = 0; i < 20000; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
    }
    return x;
}

__attribute__((noinline)) uint64_t leaf_sum(uint64_t x) {
    volatile uint64_t acc = x;
    for (int i = 0; i < 20000; i++)
        acc += (uint64_t)i * 2654435761u;
    return acc;
}

/* A recursion of 0-7 extra frames, so the same leaf shows up under several stack depths. */
__attribute__((noinline)) uint64_t depth_walk(uint64_t x, int levels) {
    if (levels <= 0) {
        switch (x % 3) {
        case 0: return leaf_mix(x);
        case 1: return leaf_hash(x);
        default: return leaf_sum(x);
        }
    }
    return depth_walk(x + 1, levels - 1) + 1;
}

__attribute__((noinline)) uint64_t chain_h(uint64_t x) { return depth_walk(x, (int)(x >> 3) & 7) + 1; }
__attribute__((noinline)) uint64_t chain_g(uint64_t x) { return chain_h(x) + 1; }
__attribute__((noinline)) uint64_t chain_f(uint64_t x) { return chain_g(x) + 1; }
__attribute__((noinline)) uint64_t chain_e(uint64_t x) { return chain_f(x) + 1; }
__attribute__((noinline)) uint64_t chain_d(uint64_t x) { return chain_e(x) + 1; }
__attribute__((noinline)) uint64_t chain_c(uint64_t x) { return chain_d(x) + 1; }
__attribute__((noinline)) uint64_t chain_b(uint64_t x) { return chain_c(x) + 1; }
__attribute__((noinline)) uint64_t chain_a(uint64_t x) { return chain_b(x) + 1; }

__attribute__((noinline)) void burn_round(uint64_t *state) {
    *state = chain_a(*state);
}

static void *worker(void *arg) {
    struct counter *mine = arg;
    uint64_t state = (uint64_t)(uintptr_t)arg;
    while (!stop) {
        burn_round(&state);
        mine->rounds++;
    }
    sink += state;
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "usage: burn [THREADS (1-%d, default: online CPUs)]\n", MAX_THREADS);
        return 2;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);

    pthread_t tids[MAX_THREADS];
    for (long i = 0; i < threads; i++) {
        if (pthread_create(&tids[i], NULL, worker, &counters[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    while (!stop) {
        uint64_t total = 0;
        for (long i = 0; i < threads; i++)
            total += counters[i].rounds;
        printf("%llu %llu %llu\n", (unsigned long long)clock_ns(CLOCK_MONOTONIC),
               (unsigned long long)total, (unsigned long long)clock_ns(CLOCK_PROCESS_CPUTIME_ID));
        usleep(100000);
    }
    for (long i = 0; i < threads; i++)
        pthread_join(tids[i], NULL);
    return 0;
}
