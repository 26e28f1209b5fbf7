/* bench/distinct.c: the distinct-stacks workload of bench/soak.sh.
 *
 *   distinct THREADS SECONDS LIFETIME [PATHS]
 *                                       for SECONDS, keeps one worker process of THREADS busy
 *                                       threads alive, replacing it every LIFETIME seconds, and
 *                                       prints how many workers and walks there were; with PATHS
 *                                       (1..2^24), walks only that many distinct call paths
 *                                       (bench/scale.sh sets how many distinct stacks there are)
 *
 * Each walk draws 64 random bits and descends a binary tree of generated functions: at level i
 * (0..DEPTH-1) bit i picks a_i or b_i, and the last level calls leaf(), which burns ~20 us of CPU.
 * So there are 2^DEPTH (16.7 M) call paths, all with the same functions but distinct stacks, and
 * nearly every sample (taken in leaf, where the time is) has a stack no earlier sample had: the
 * distinct stacks a profiler sees grow with its samples (2 CPUs at 4999 Hz: up to ~600 k a minute).
 * Replacing the worker process every LIFETIME seconds spreads them over processes that exit.
 *
 * Build: cc -O1 -g -fno-inline -fno-optimize-sibling-calls -pthread, with -fno-omit-frame-pointer
 * (frame pointers: walkable by both of ember's unwinders) or -fomit-frame-pointer (only the DWARF
 * unwinder, the default, gets past leaf).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 24
#define MAX_THREADS 64

volatile uint64_t sink;

typedef void (*level_fn)(uint64_t bits);
/* levels[i][b]: the function of level i for bit value b; levels[DEPTH][*] is leaf. */
extern level_fn levels[DEPTH + 1][2];

__attribute__((noinline)) void leaf(uint64_t bits) {
    uint64_t x = bits;
    for (int i = 0; i < 20000; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    sink += x;
}

/* a_i / b_i: one level of the tree; the next level's function is picked by bit i+1. */
#define LEVEL(i)                                                           \
    __attribute__((noinline)) void a_##i(uint64_t bits) {                  \
        levels[(i) + 1][(bits >> ((i) + 1)) & 1](bits);                   \
        sink++;                                                            \
    }                                                                      \
    __attribute__((noinline)) void b_##i(uint64_t bits) {                  \
        levels[(i) + 1][(bits >> ((i) + 1)) & 1](bits);                   \
        sink--;                                                            \
    }
LEVEL(0) LEVEL(1) LEVEL(2) LEVEL(3) LEVEL(4) LEVEL(5) LEVEL(6) LEVEL(7) LEVEL(8) LEVEL(9)
LEVEL(10) LEVEL(11) LEVEL(12) LEVEL(13) LEVEL(14) LEVEL(15) LEVEL(16) LEVEL(17) LEVEL(18)
LEVEL(19) LEVEL(20) LEVEL(21) LEVEL(22) LEVEL(23)

#define PAIR(i) {a_##i, b_##i},
level_fn levels[DEPTH + 1][2] = {
    PAIR(0) PAIR(1) PAIR(2) PAIR(3) PAIR(4) PAIR(5) PAIR(6) PAIR(7) PAIR(8) PAIR(9) PAIR(10)
    PAIR(11) PAIR(12) PAIR(13) PAIR(14) PAIR(15) PAIR(16) PAIR(17) PAIR(18) PAIR(19) PAIR(20)
    PAIR(21) PAIR(22) PAIR(23) {leaf, leaf}};

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Distinct call paths walked: 0 is all 2^DEPTH. */
static uint64_t paths;

struct worker {
    pthread_t thread;
    uint64_t rng;
    double deadline;
    uint64_t walks;
};

static void *walk(void *arg) {
    struct worker *w = arg;
    uint64_t rng = w->rng;
    while (seconds(CLOCK_MONOTONIC) < w->deadline) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        /* With PATHS, the path is a number below it: its bits pick the functions. */
        uint64_t bits = paths ? rng % paths : rng;
        levels[0][bits & 1](bits);
        w->walks++;
    }
    return NULL;
}

/* One worker process: THREADS threads walking until `deadline`; exits with nothing to say. */
static int work(int threads, double deadline, int pipe_fd) {
    static struct worker workers[MAX_THREADS];
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t seed = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^ 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < threads; t++) {
        workers[t].rng = seed + 0x2545f4914f6cdd1dull * (uint64_t)(t + 1);
        workers[t].deadline = deadline;
        if (pthread_create(&workers[t].thread, NULL, walk, &workers[t]) != 0) {
            perror("distinct: pthread_create");
            return 1;
        }
    }
    uint64_t walks = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(workers[t].thread, NULL);
        walks += workers[t].walks;
    }
    return write(pipe_fd, &walks, sizeof walks) == sizeof walks ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s THREADS SECONDS LIFETIME [PATHS]\n", argv[0]);
        return 2;
    }
    if (argc == 5) {
        paths = strtoull(argv[4], NULL, 10);
        if (paths < 1 || paths > (1ull << DEPTH)) {
            fprintf(stderr, "distinct: PATHS 1..%llu\n", 1ull << DEPTH);
            return 2;
        }
    }
    int threads = atoi(argv[1]);
    double duration = atof(argv[2]), lifetime = atof(argv[3]);
    if (threads < 1 || threads > MAX_THREADS || duration <= 0 || lifetime <= 0) {
        fprintf(stderr, "distinct: THREADS 1..%d, SECONDS and LIFETIME > 0\n", MAX_THREADS);
        return 2;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        perror("distinct: pipe");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    double end = seconds(CLOCK_MONOTONIC) + duration;
    unsigned long workers = 0, failed = 0;
    uint64_t walks = 0;
    while (seconds(CLOCK_MONOTONIC) < end) {
        double deadline = seconds(CLOCK_MONOTONIC) + lifetime;
        if (deadline > end)
            deadline = end;
        pid_t pid = fork();
        if (pid == 0) {
            /* Dies with the parent (bench/soak.sh stops only the pids it started). */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() == 1)
                _exit(0);
            _exit(work(threads, deadline, fds[1]));
        }
        if (pid < 0) {
            failed++;
            sleep(1);
            continue;
        }
        workers++;
        int status;
        waitpid(pid, &status, 0);
        uint64_t n;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && read(fds[0], &n, sizeof n) == sizeof n)
            walks += n;
        else
            failed++;
    }
    printf("{\"workers\":%lu,\"failed\":%lu,\"walks\":%llu}\n", workers, failed,
           (unsigned long long)walks);
    return 0;
}
