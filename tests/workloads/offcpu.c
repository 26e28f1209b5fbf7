/*
 * offcpu: the ground truth of off-CPU profiles. Waits for a line on stdin (the test sends it
 * once the profiler has this program's unwind tables; meanwhile the main thread wakes every
 * 20 ms, so the profiler sees it), then runs four threads for SECONDS (argv[1]), each naming
 * itself:
 *   - sleeper: burns 2 ms of its own CPU time in `offcpu_burn`, then sleeps 8 ms in
 *     `offcpu_sleep`, over and over: about 80% of its wall time is off-CPU, under
 *     offcpu_sleep;
 *   - reader: reads a pipe in `offcpu_read_pipe`; the main thread writes one byte to it every
 *     50 ms, so the reader is blocked there nearly all the time;
 *   - locker1, locker2: take one mutex in turn in `offcpu_lock`, each holding it for a 5 ms
 *     sleep, so each waits for the other in pthread_mutex_lock.
 * At the end prints one JSON line: the sleeper's wall and CPU time in nanoseconds.
 *
 * `offcpu SECONDS pingpong` runs two threads, ping and pong, that pass one byte back and forth
 * over two pipes instead (tens of thousands of context switches a second, every wait far
 * shorter than a millisecond), each blocked in `offcpu_ping_read`; at the end prints ping's
 * wall time, CPU time and run-queue wait (from /proc/thread-self/schedstat) and the round
 * trips. An optional fourth argument is CPU nanoseconds ping burns per round trip (fewer
 * switches a second: the benchmark's pace).
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pipe_fds[2];
static uint64_t sleeper_wall_ns, sleeper_cpu_ns;
static int ping_fds[2], pong_fds[2];
static uint64_t ping_wall_ns, ping_cpu_ns, ping_rq_ns, round_trips, work_ns;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void offcpu_burn(uint64_t ns) {
    uint64_t until = now_ns(CLOCK_THREAD_CPUTIME_ID) + ns;
    volatile unsigned long x = 0;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) < until)
        for (int i = 0; i < 1000; i++)
            x += i;
}

__attribute__((noinline)) void offcpu_sleep(long ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) int offcpu_read_pipe(void) {
    char byte;
    int n = (int)read(pipe_fds[0], &byte, 1);
    __asm__ volatile("" ::: "memory");
    return n;
}

__attribute__((noinline)) void offcpu_lock(void) {
    pthread_mutex_lock(&lock);
    __asm__ volatile("" ::: "memory");
}

/* CPU time and run-queue wait of the calling thread, from the kernel's schedstat. */
static void schedstat(uint64_t *cpu, uint64_t *rq) {
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    unsigned long long c = 0, r = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &c, &r) != 2)
            c = r = 0;
        fclose(f);
    }
    *cpu = c;
    *rq = r;
}

__attribute__((noinline)) int offcpu_ping_read(int fd) {
    char byte;
    int n = (int)read(fd, &byte, 1);
    __asm__ volatile("" ::: "memory");
    return n;
}

static void *ping(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "ping");
    uint64_t cpu0, rq0, cpu1, rq1;
    uint64_t wall = now_ns(CLOCK_MONOTONIC);
    schedstat(&cpu0, &rq0);
    while (!stop) {
        if (write(ping_fds[1], "p", 1) != 1 || offcpu_ping_read(pong_fds[0]) != 1)
            break;
        if (work_ns)
            offcpu_burn(work_ns);
        round_trips++;
    }
    schedstat(&cpu1, &rq1);
    ping_wall_ns = now_ns(CLOCK_MONOTONIC) - wall;
    ping_cpu_ns = cpu1 - cpu0;
    ping_rq_ns = rq1 - rq0;
    close(ping_fds[1]);
    return NULL;
}

static void *pong(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "pong");
    while (offcpu_ping_read(ping_fds[0]) == 1)
        if (write(pong_fds[1], "q", 1) != 1)
            break;
    return NULL;
}

static int pingpong(int seconds) {
    if (pipe(ping_fds) != 0 || pipe(pong_fds) != 0)
        return 1;
    pthread_t threads[2];
    pthread_create(&threads[0], NULL, ping, NULL);
    pthread_create(&threads[1], NULL, pong, NULL);
    sleep(seconds);
    stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    printf("{\"ping_wall_ns\": %llu, \"ping_cpu_ns\": %llu, \"ping_rq_ns\": %llu, "
           "\"round_trips\": %llu}\n",
           (unsigned long long)ping_wall_ns, (unsigned long long)ping_cpu_ns,
           (unsigned long long)ping_rq_ns, (unsigned long long)round_trips);
    return 0;
}

static void *sleeper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    uint64_t wall = now_ns(CLOCK_MONOTONIC), cpu = now_ns(CLOCK_THREAD_CPUTIME_ID);
    while (!stop) {
        offcpu_burn(2000000);
        offcpu_sleep(8);
    }
    sleeper_wall_ns = now_ns(CLOCK_MONOTONIC) - wall;
    sleeper_cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    while (offcpu_read_pipe() == 1 && !stop)
        ;
    return NULL;
}

static void *locker(void *arg) {
    pthread_setname_np(pthread_self(), (const char *)arg);
    while (!stop) {
        offcpu_lock();
        struct timespec hold = {0, 5000000L};
        nanosleep(&hold, NULL);
        pthread_mutex_unlock(&lock);
        sched_yield();
    }
    return NULL;
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 3;
    if (pipe(pipe_fds) != 0)
        return 1;
    struct pollfd in = {0, POLLIN, 0};
    while (poll(&in, 1, 20) == 0)
        ;
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    if (argc > 2 && strcmp(argv[2], "pingpong") == 0) {
        work_ns = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
        return pingpong(seconds);
    }
    pthread_t threads[4];
    pthread_create(&threads[0], NULL, sleeper, NULL);
    pthread_create(&threads[1], NULL, reader, NULL);
    pthread_create(&threads[2], NULL, locker, "locker1");
    pthread_create(&threads[3], NULL, locker, "locker2");
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)seconds * 1000000000ull;
    while (now_ns(CLOCK_MONOTONIC) < end) {
        struct timespec tick = {0, 50000000L};
        nanosleep(&tick, NULL);
        if (write(pipe_fds[1], "x", 1) != 1)
            return 1;
    }
    stop = 1;
    if (write(pipe_fds[1], "x", 1) != 1)
        return 1;
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    printf("{\"sleeper_wall_ns\": %llu, \"sleeper_cpu_ns\": %llu}\n",
           (unsigned long long)sleeper_wall_ns, (unsigned long long)sleeper_cpu_ns);
    return 0;
}
