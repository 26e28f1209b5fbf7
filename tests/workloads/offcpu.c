/*
 * offcpu: the ground truth of off-CPU profiles. Three threads, each blocked in a function of
 * its own, for SECONDS seconds (argv[1]):
 *   - sleeper: burns 2 ms of its own CPU time in `offcpu_burn`, then sleeps 8 ms in
 *     `offcpu_sleep` (nanosleep), over and over: 80% of its wall time is off-CPU, under
 *     offcpu_sleep;
 *   - reader: blocks in `offcpu_read_pipe` on a pipe nobody writes to until the end;
 *   - two lockers: take one mutex in turn in `offcpu_lock`, each holding it 5 ms (a sleep
 *     under the lock), so each one waits about half the time in pthread_mutex_lock.
 * Prints "ready" on stdout once the threads run; exits after SECONDS.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pipe_fds[2];

static double thread_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) void offcpu_burn(double ms) {
    double until = thread_cpu_ms() + ms;
    volatile unsigned long x = 0;
    while (thread_cpu_ms() < until)
        for (int i = 0; i < 1000; i++)
            x += i;
}

__attribute__((noinline)) void offcpu_sleep(long ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void offcpu_read_pipe(void) {
    char byte;
    if (read(pipe_fds[0], &byte, 1) < 0)
        perror("read");
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void offcpu_lock(void) {
    pthread_mutex_lock(&lock);
    __asm__ volatile("" ::: "memory");
}

static void *sleeper(void *arg) {
    (void)arg;
    while (!stop) {
        offcpu_burn(2.0);
        offcpu_sleep(8);
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    offcpu_read_pipe();
    return NULL;
}

static void *locker(void *arg) {
    (void)arg;
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
    int seconds = argc > 1 ? atoi(argv[1]) : 5;
    if (pipe(pipe_fds) != 0)
        return 1;
    pthread_t threads[4];
    pthread_create(&threads[0], NULL, sleeper, NULL);
    pthread_create(&threads[1], NULL, reader, NULL);
    pthread_create(&threads[2], NULL, locker, NULL);
    pthread_create(&threads[3], NULL, locker, NULL);
    pthread_setname_np(threads[0], "sleeper");
    pthread_setname_np(threads[1], "reader");
    pthread_setname_np(threads[2], "locker1");
    pthread_setname_np(threads[3], "locker2");
    printf("ready\n");
    fflush(stdout);
    sleep(seconds);
    stop = 1;
    if (write(pipe_fds[1], "x", 1) != 1)
        return 1;
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
