/*
 * shortlived: short-lived processes, for the tests that they are not lost. One source, two programs:
 *
 *   shortlived launch SECONDS RATE CHILD   fork+execs CHILD RATE times a second for SECONDS,
 *                                          reaps each with wait4 and prints, as one JSON line,
 *                                          how many ran and the CPU time their rusage reports
 *   CHILD burn MS                          burns MS ms of its own CPU time in
 *                                          main -> burn_outer -> burn_leaf, then exits
 *   shortlived reuse ROUNDS MS A B         (root) ROUNDS times: runs A (burn MS), reaps it,
 *                                          then runs B under the very pid A had (forced through
 *                                          /proc/sys/kernel/ns_last_pid, retried while other
 *                                          processes take it); prints the rounds that got the
 *                                          pid and the CPU time of A and of B
 *
 * Child i burns 50 + (13 i mod 31) ms, so each lives about 50-80 ms when it has a CPU.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* About 0.2 ms of arithmetic per call: the CPU-time check between calls is a tiny share. */
__attribute__((noinline)) void burn_leaf(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 100000; i > 0; i--)
        acc = acc * 6364136223846793005ull + 1442695040888963407ull + i;
    sink = acc;
}

__attribute__((noinline)) void burn_outer(uint64_t until_cpu_ns) {
    while (clock_ns(CLOCK_PROCESS_CPUTIME_ID) < until_cpu_ns)
        burn_leaf();
}

static int burn(long ms) {
    burn_outer(clock_ns(CLOCK_PROCESS_CPUTIME_ID) + (uint64_t)ms * 1000000ull);
    return 0;
}

static uint64_t rusage_ns(const struct rusage *ru) {
    return ((uint64_t)ru->ru_utime.tv_sec + (uint64_t)ru->ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)ru->ru_utime.tv_usec + (uint64_t)ru->ru_stime.tv_usec) * 1000ull;
}

struct totals {
    long started, reaped, failed;
    uint64_t cpu_ns;
};

static void reap(struct totals *t, int options) {
    for (;;) {
        int status;
        struct rusage ru;
        pid_t pid = wait4(-1, &status, options, &ru);
        if (pid <= 0)
            return;
        t->reaped++;
        t->cpu_ns += rusage_ns(&ru);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            t->failed++;
    }
}

static int launch(double seconds, double rate, const char *child) {
    struct totals t = {0};
    uint64_t period = (uint64_t)(1e9 / rate);
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    uint64_t end = start + (uint64_t)(seconds * 1e9);
    for (uint64_t next = start; next < end; next += period) {
        struct timespec at = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
            ;
        char ms[16];
        snprintf(ms, sizeof ms, "%ld", 50 + (13 * t.started) % 31);
        pid_t pid = fork();
        if (pid == 0) {
            execl(child, child, "burn", ms, (char *)NULL);
            _exit(127);
        }
        if (pid > 0)
            t.started++;
        else
            t.failed++;
        reap(&t, WNOHANG);
    }
    while (t.reaped < t.started) {
        long before = t.reaped;
        reap(&t, 0);
        if (t.reaped == before)
            break;
    }
    printf("{\"started\":%ld,\"reaped\":%ld,\"failed\":%ld,\"cpu_ns\":%llu}\n", t.started,
           t.reaped, t.failed, (unsigned long long)t.cpu_ns);
    return t.failed != 0;
}

/* Runs `path burn ms` in a child (under `want` when nonzero: else the child exits at once,
 * status 3) and reaps it; returns its pid, its CPU time in *cpu_ns, or -1. */
static pid_t run_child(const char *path, const char *ms, pid_t want, uint64_t *cpu_ns) {
    pid_t pid = fork();
    if (pid == 0) {
        if (want != 0 && getpid() != want)
            _exit(3);
        execl(path, path, "burn", ms, (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid)
        return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return want != 0 && pid != want ? 0 : -1;
    *cpu_ns += rusage_ns(&ru);
    return pid;
}

static int reuse(long rounds, const char *ms, const char *a, const char *b) {
    uint64_t cpu_a = 0, cpu_b = 0;
    long reused = 0, tries = 0;
    for (long r = 0; r < rounds; r++) {
        uint64_t this_a = 0;
        pid_t pid = run_child(a, ms, 0, &this_a);
        if (pid <= 0)
            return 1;
        for (int attempt = 0; attempt < 200; attempt++) {
            FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
            if (!f)
                return 1;
            fprintf(f, "%d", pid - 1);
            if (fclose(f) != 0)
                return 1;
            tries++;
            uint64_t this_b = 0;
            pid_t got = run_child(b, ms, pid, &this_b);
            if (got < 0)
                return 1;
            if (got == pid) {
                cpu_a += this_a;
                cpu_b += this_b;
                reused++;
                break;
            }
        }
    }
    printf("{\"rounds\":%ld,\"reused\":%ld,\"tries\":%ld,\"cpu_a_ns\":%llu,\"cpu_b_ns\":%llu}\n",
           rounds, reused, tries, (unsigned long long)cpu_a, (unsigned long long)cpu_b);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "reuse") == 0)
        return reuse(atol(argv[2]), argv[3], argv[4], argv[5]);
    if (argc == 3 && strcmp(argv[1], "burn") == 0)
        return burn(atol(argv[2]));
    if (argc == 5 && strcmp(argv[1], "launch") == 0)
        return launch(atof(argv[2]), atof(argv[3]), argv[4]);
    fprintf(stderr, "usage: %s launch SECONDS RATE CHILD | %s burn MS\n", argv[0], argv[0]);
    return 2;
}
