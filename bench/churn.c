/* bench/churn.c: the workload of bench/soak.sh.
 *
 *   churn spawn RATE SECONDS MS   starts RATE processes per second for SECONDS (each `churn MS`),
 *                                 reaps them, and prints how many it started
 *   churn MS                      burns MS ms of CPU, walking random call chains through 256
 *                                 generated functions (depth 8..39), then exits
 *
 * Each chain is drawn afresh every ~30 us, so nearly every sample of a churn process has a stack
 * no earlier sample had: distinct stacks grow with the samples, as on a machine running many
 * different short-lived programs. Built with frame pointers and no inlining or tail calls, so the
 * chain is what the sampler walks.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NFUNCS 256

static uint64_t rng;
volatile uint64_t sink;

static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef void (*step_fn)(int);
extern step_fn table[NFUNCS];

__attribute__((noinline)) static void burn(void) {
    for (int i = 0; i < 5000; i++)
        sink += (uint64_t)i * (uint64_t)i;
}

/* f_A_B: one link of a chain; calls a random next link until the depth is used up. */
#define F(a, b)                                                  \
    __attribute__((noinline)) void f_##a##_##b(int depth) {      \
        if (depth <= 0) {                                        \
            burn();                                              \
            return;                                              \
        }                                                        \
        table[next_random() % NFUNCS](depth - 1);                \
        sink++;                                                  \
    }
#define ROW(a)                                                                                 \
    F(a, 0) F(a, 1) F(a, 2) F(a, 3) F(a, 4) F(a, 5) F(a, 6) F(a, 7) F(a, 8) F(a, 9) F(a, 10) \
    F(a, 11) F(a, 12) F(a, 13) F(a, 14) F(a, 15)
ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11) ROW(12)
ROW(13) ROW(14) ROW(15)

#define T(a, b) f_##a##_##b,
#define TROW(a)                                                                                 \
    T(a, 0) T(a, 1) T(a, 2) T(a, 3) T(a, 4) T(a, 5) T(a, 6) T(a, 7) T(a, 8) T(a, 9) T(a, 10) \
    T(a, 11) T(a, 12) T(a, 13) T(a, 14) T(a, 15)
step_fn table[NFUNCS] = {TROW(0) TROW(1) TROW(2) TROW(3) TROW(4) TROW(5) TROW(6) TROW(7) TROW(8)
                             TROW(9) TROW(10) TROW(11) TROW(12) TROW(13) TROW(14) TROW(15)};

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int burn_ms(double ms) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    rng = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^ 0x9e3779b97f4a7c15ull;
    double start = seconds(CLOCK_PROCESS_CPUTIME_ID);
    while ((seconds(CLOCK_PROCESS_CPUTIME_ID) - start) * 1000.0 < ms)
        table[next_random() % NFUNCS](8 + (int)(next_random() % 32));
    return 0;
}

static int spawn(const char *self, double rate, double duration, const char *ms) {
    double start = seconds(CLOCK_MONOTONIC);
    unsigned long started = 0, failed = 0;
    signal(SIGPIPE, SIG_IGN);
    for (;;) {
        double elapsed = seconds(CLOCK_MONOTONIC) - start;
        if (elapsed >= duration)
            break;
        while ((double)started < elapsed * rate) {
            pid_t pid = fork();
            if (pid == 0) {
                execl(self, self, ms, (char *)NULL);
                _exit(127);
            }
            if (pid < 0)
                failed++;
            started++;
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    while (waitpid(-1, NULL, 0) > 0) {
    }
    printf("{\"started\":%lu,\"fork_failed\":%lu}\n", started, failed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && argv[1][0] == 's')
        return spawn(argv[0], atof(argv[2]), atof(argv[3]), argv[4]);
    return burn_ms(argc > 1 ? atof(argv[1]) : 5.0);
}
