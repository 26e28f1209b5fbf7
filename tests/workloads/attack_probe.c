/*
 * attack_probe: tries to read another process's memory and descriptors the ways the
 * memory-and-descriptor attack did, and prints one JSON line saying what each attempt gave ("ok" or the errno name).
 *
 *   attack_probe PID FD...
 *
 * Attempts: open /proc/PID/mem read-only and read 1 byte at a mapped address (from
 * /proc/PID/maps when readable), open /proc/PID/fd/N read-only, and pidfd_getfd(N).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static const char *result(int ok) {
    static char text[64];
    if (ok)
        return "ok";
    snprintf(text, sizeof text, "%s", strerrorname_np(errno) ? strerrorname_np(errno) : "?");
    return text;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: attack_probe PID FD...\n");
        return 2;
    }
    int pid = atoi(argv[1]);
    char path[128];
    printf("{\"uid\":%u,\"gid\":%u", getuid(), getgid());

    snprintf(path, sizeof path, "/proc/%d/mem", pid);
    int mem = open(path, O_RDONLY);
    printf(",\"mem_open\":\"%s\"", result(mem >= 0));
    if (mem >= 0) {
        /* Read the first byte of the first mapping, when the maps are readable. */
        snprintf(path, sizeof path, "/proc/%d/maps", pid);
        FILE *maps = fopen(path, "r");
        unsigned long long start = 0;
        if (maps && fscanf(maps, "%llx", &start) == 1) {
            char byte;
            ssize_t n = pread(mem, &byte, 1, (off_t)start);
            printf(",\"mem_read\":\"%s\"", result(n == 1));
        } else {
            printf(",\"mem_read\":\"maps unreadable\"");
        }
        if (maps)
            fclose(maps);
        close(mem);
    }

    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    printf(",\"pidfd_open\":\"%s\"", result(pidfd >= 0));
    printf(",\"fds\":{");
    for (int i = 2; i < argc; i++) {
        int n = atoi(argv[i]);
        snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, n);
        int fd = open(path, O_RDONLY);
        printf("%s\"%d\":{\"open\":\"%s\"", i > 2 ? "," : "", n, result(fd >= 0));
        if (fd >= 0)
            close(fd);
        if (pidfd >= 0) {
            int got = (int)syscall(SYS_pidfd_getfd, pidfd, n, 0);
            printf(",\"getfd\":\"%s\"}", result(got >= 0));
            if (got >= 0)
                close(got);
        } else {
            printf(",\"getfd\":\"no pidfd\"}");
        }
    }
    printf("}}\n");
    return 0;
}
