/*
 * syscalls: spends its time in the kernel. A tight loop of 1-byte write()s to /dev/null and
 * getppid() calls for argv[1] seconds (or until SIGTERM/SIGINT), so that most samples carry
 * kernel frames (the write path, the syscall entry) above the user frames
 * main -> syscall_loop.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One round: many small syscalls. Returns how many were made. */
__attribute__((noinline)) uint64_t syscall_loop(int fd) {
    uint64_t calls = 0;
    for (int i = 0; i < 1000; i++) {
        if (write(fd, "x", 1) != 1)
            abort();
        (void)getppid();
        calls += 2;
    }
    return calls;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        perror("open /dev/null");
        return 1;
    }
    uint64_t deadline = monotonic_ns() + (uint64_t)(seconds * 1e9);
    uint64_t calls = 0;
    while (!stop && monotonic_ns() < deadline)
        calls += syscall_loop(fd);
    printf("{\"syscalls\":%llu}\n", (unsigned long long)calls);
    fflush(stdout);
    return 0;
}
