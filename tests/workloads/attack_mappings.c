/*
 * attack_mappings: an unprivileged process with very many executable file mappings (the mapping-flood
 * and long-path attacks), spinning so that the profiler sees it.
 *
 *   attack_mappings same DIR COUNT PATHLEN SECONDS
 *       one 4 KiB file under a path of about PATHLEN bytes (nested directories below DIR),
 *       mapped executable COUNT times: the process facts grow with COUNT x PATHLEN.
 *   attack_mappings distinct DIR COUNT 0 SECONDS
 *       COUNT distinct 4 KiB files DIR/fNNNNN, each mapped executable once: the sampler passes
 *       COUNT descriptors.
 *
 * The mappings are one page each with an unmapped guard page between them, so the kernel never
 * merges them. After mapping it prints {"ready":true,"mappings":COUNT} and spins in main ->
 * attack_spin for SECONDS (or until SIGTERM).
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

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

static void die(const char *what) {
    fprintf(stderr, "attack_mappings: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* A 4 KiB file at `path`, opened read-only. */
static int make_file(const char *path) {
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0)
        die(path);
    static char page[PAGE];
    memset(page, 0xc3, sizeof page); /* ret */
    if (write(fd, page, sizeof page) != (ssize_t)sizeof page)
        die("write");
    return fd;
}

__attribute__((noinline)) void attack_spin(void) {
    volatile uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: attack_mappings same|distinct DIR COUNT PATHLEN SECONDS\n");
        return 2;
    }
    const char *mode = argv[1];
    const char *dir = argv[2];
    long count = atol(argv[3]);
    long path_len = atol(argv[4]);
    double seconds = atof(argv[5]);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    char *reserve = mmap(NULL, (size_t)count * 2 * PAGE, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserve == MAP_FAILED)
        die("reserving address space");

    if (strcmp(mode, "same") == 0) {
        /* Nested directories of 200-byte names until the path is about path_len bytes. */
        static char path[4096];
        snprintf(path, sizeof path, "%s", dir);
        char component[201];
        memset(component, 'a', 200);
        component[200] = '\0';
        while ((long)strlen(path) + 201 + 8 < path_len && strlen(path) + 210 < sizeof path) {
            strcat(path, "/");
            strcat(path, component);
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                die(path);
        }
        /* Pad the last name so the whole path is path_len bytes. */
        size_t len = strlen(path);
        strcat(path, "/");
        len++;
        long pad = path_len - (long)len;
        if (pad < 1)
            pad = 1;
        if (pad > 250)
            pad = 250;
        memset(path + len, 'f', (size_t)pad);
        path[len + (size_t)pad] = '\0';
        int fd = make_file(path);
        for (long i = 0; i < count; i++) {
            if (mmap(reserve + i * 2 * PAGE, PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED,
                     fd, 0) == MAP_FAILED)
                die("mmap");
        }
        close(fd);
        fprintf(stderr, "attack_mappings: %ld mappings of a file under a %zu-byte path\n", count,
                strlen(path));
    } else if (strcmp(mode, "distinct") == 0) {
        for (long i = 0; i < count; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/f%05ld", dir, i);
            int fd = make_file(path);
            if (mmap(reserve + i * 2 * PAGE, PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED,
                     fd, 0) == MAP_FAILED)
                die("mmap");
            close(fd);
        }
        fprintf(stderr, "attack_mappings: %ld distinct files mapped\n", count);
    } else {
        fprintf(stderr, "attack_mappings: unknown mode %s\n", mode);
        return 2;
    }
    printf("{\"ready\":true,\"mappings\":%ld}\n", count);
    fflush(stdout);

    uint64_t deadline = monotonic_ns() + (uint64_t)(seconds * 1e9);
    while (!stop && monotonic_ns() < deadline)
        attack_spin();
    return 0;
}
