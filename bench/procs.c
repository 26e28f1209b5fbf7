/* bench/procs.c: many processes, a few of them busy: the process-count workload of bench/scale.sh.
 *
 *   procs IDLE BUSY SECONDS [WAKE_MS]
 *
 * Starts IDLE processes that sleep and BUSY processes that burn CPU, keeps them for SECONDS,
 * then ends them all and prints how many it started. Busy process i burns in a recursion whose
 * depth (8..23) and function at each level (spin_a or spin_b) follow from i, so each has stacks
 * of its own, as distinct programs would. With WAKE_MS > 0, every idle process wakes about every
 * WAKE_MS ms (each on its own phase) and burns ~100 us, as daemons' timers do: a share of them is
 * then sampled in each interval; with 0 (the default) they sleep throughout.
 *
 * Build: cc -O1 -g -fno-inline -fno-optimize-sibling-calls (frame pointers or not: either).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

static void burn_us(long us) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 1000; i++)
            sink = sink * 6364136223846793005ull + 1442695040888963407ull;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

__attribute__((noinline)) void spin_a(unsigned bits, int depth);
__attribute__((noinline)) void spin_b(unsigned bits, int depth);

__attribute__((noinline)) void spin_a(unsigned bits, int depth) {
    if (depth == 0) {
        burn_us(1000);
        return;
    }
    ((bits >> depth) & 1 ? spin_b : spin_a)(bits, depth - 1);
    sink++;
}

__attribute__((noinline)) void spin_b(unsigned bits, int depth) {
    if (depth == 0) {
        burn_us(1000);
        return;
    }
    ((bits >> depth) & 1 ? spin_a : spin_b)(bits, depth - 1);
    sink--;
}

static void child(int busy, unsigned index, long wake_ms) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1)
        _exit(0);
    if (busy) {
        int depth = 8 + (int)(index % 16);
        for (;;)
            spin_a(index * 2654435761u, depth);
    }
    if (wake_ms <= 0)
        for (;;)
            pause();
    /* Each on its own phase, so the wake-ups spread over the period. */
    usleep((useconds_t)((index * 7919u) % (unsigned)(wake_ms * 1000)));
    for (;;) {
        burn_us(100);
        usleep((useconds_t)(wake_ms * 1000));
    }
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s IDLE BUSY SECONDS [WAKE_MS]\n", argv[0]);
        return 2;
    }
    long idle = atol(argv[1]), busy = atol(argv[2]);
    double seconds = atof(argv[3]);
    long wake_ms = argc == 5 ? atol(argv[4]) : 0;
    if (idle < 0 || busy < 0 || idle + busy > 30000 || seconds <= 0 || wake_ms < 0) {
        fprintf(stderr, "procs: IDLE + BUSY <= 30000, SECONDS > 0, WAKE_MS >= 0\n");
        return 2;
    }
    pid_t *pids = calloc((size_t)(idle + busy + 1), sizeof *pids);
    if (!pids)
        return 1;
    long started = 0, failed = 0;
    for (long i = 0; i < idle + busy; i++) {
        pid_t pid = fork();
        if (pid == 0)
            child(i < busy, (unsigned)i, wake_ms);
        if (pid < 0)
            failed++;
        else
            pids[started++] = pid;
    }
    /* Started: bench/scale.sh waits for this line before it measures. */
    printf("{\"started\":%ld,\"failed\":%ld}\n", started, failed);
    fflush(stdout);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    /* Only its own children: it may share a process group with whoever started it. */
    for (long i = 0; i < started; i++)
        kill(pids[i], SIGKILL);
    while (wait(NULL) > 0)
        ;
    return 0;
}
