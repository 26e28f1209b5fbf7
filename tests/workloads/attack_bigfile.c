/*
 * attack_bigfile: the big-file attack (a mapping too large to copy). Creates PATH as a sparse file of SIZE_MIB MiB, mode 0700
 * (so a relay running as another user cannot reopen it and must read it through the passed
 * descriptor), writes `jmp .` (eb fe) at its start, maps the whole file executable and jumps
 * there: the process spins inside the big file's mapping until SECONDS have passed (SIGALRM,
 * default action) or it is killed.
 *
 *   attack_bigfile PATH SIZE_MIB SECONDS
 *
 * Prints {"ready":true} just before the jump.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "attack_bigfile: %s: %s\n", what, strerror(errno));
    exit(2);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: attack_bigfile PATH SIZE_MIB SECONDS\n");
        return 2;
    }
    const char *path = argv[1];
    off_t size = (off_t)atoll(argv[2]) << 20;
    unsigned seconds = (unsigned)atoi(argv[3]);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0700);
    if (fd < 0)
        die(path);
    if (fchmod(fd, 0700) != 0)
        die("fchmod");
    if (ftruncate(fd, size) != 0)
        die("ftruncate");
    static const unsigned char jmp_self[] = {0xeb, 0xfe};
    if (pwrite(fd, jmp_self, sizeof jmp_self, 0) != (ssize_t)sizeof jmp_self)
        die("pwrite");
    void *code = mmap(NULL, (size_t)size, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
    if (code == MAP_FAILED)
        die("mmap");
    close(fd);
    printf("{\"ready\":true,\"bytes\":%lld}\n", (long long)size);
    fflush(stdout);
    alarm(seconds);
    ((void (*)(void))code)();
    return 0;
}
