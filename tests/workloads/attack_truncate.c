/*
 * attack_truncate: the truncated-file attack. Copies the C library this process runs on to COPY
 * (owned by this user, mode 0644, so a relay can reopen it through its descriptor and map it),
 * maps the copy executable, and spins in `fake_spin` with rbp pointing at crafted frame-pointer
 * chains whose return addresses are functions of the copy spread over its whole text: the
 * profiler's user stack walk (it follows rbp through user memory) reports those addresses, and
 * the relay has to read the copy to name them. After BEFORE seconds it truncates the copy to 0
 * bytes and keeps spinning with new fake addresses (other offsets into the same functions), so
 * the relay has to look into the truncated file again. The copy's GNU build id is altered, so
 * that a relay keying files by build id cannot use the real libc in its place.
 *
 *   attack_truncate COPY BEFORE_SECONDS TOTAL_SECONDS
 *
 * Prints {"ready":true,...} before spinning and {"truncated":true} after the truncation.
 * Build with -ldl on old glibc (dladdr, dlsym).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
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

#define FRAMES 24
#define CHAINS 32

struct frame {
    struct frame *next;
    uint64_t ret;
};

static struct frame chains[2][CHAINS][FRAMES];
static volatile sig_atomic_t stop;

/* fake_spin(chain, iterations): spins with rbp = chain, then restores rbp. */
void fake_spin(struct frame *chain, uint64_t iterations);
__asm__(".text\n"
        ".globl fake_spin\n"
        ".type fake_spin, @function\n"
        "fake_spin:\n"
        "    push %rbp\n"
        "    mov %rdi, %rbp\n"
        "1:  dec %rsi\n"
        "    jnz 1b\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size fake_spin, .-fake_spin\n");

/* Exported, non-IFUNC functions spread over libc's text. */
static const char *const names[] = {
    "printf", "fprintf", "snprintf", "malloc", "free", "calloc", "realloc", "qsort",
    "bsearch", "fopen", "fclose", "fread", "fwrite", "fgets", "fputs", "puts",
    "getenv", "setenv", "atoi", "strtol", "strtoul", "strtod", "localtime", "gmtime",
    "mktime", "strftime", "sleep", "usleep", "lseek", "socket", "connect", "bind",
    "listen", "accept", "pthread_create", "pthread_join", "pthread_mutex_lock",
    "pthread_mutex_unlock", "fork", "execve", "waitpid", "signal", "sigaction", "raise",
    "abort", "exit", "atexit", "regcomp", "regexec", "glob", "getaddrinfo", "inet_pton",
    "syslog", "qsort_r", "munmap", "mprotect", "opendir", "readdir", "closedir", "mkdir",
    "rmdir", "unlink", "rename", "setlocale", "iconv_open", "iconv", "getpwnam", "getgrnam",
    "fnmatch", "wordexp", "tmpfile", "perror", "strerror", "getline", "scanf", "sscanf",
};
#define NAMES (sizeof names / sizeof names[0])

static void die(const char *what) {
    fprintf(stderr, "attack_truncate: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Flips the bytes of the copy's NT_GNU_BUILD_ID note (found through its PT_NOTE segments). */
static void patch_build_id(int fd, off_t size) {
    unsigned char *elf = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (elf == MAP_FAILED)
        die("mmap for the build id");
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;
    int patched = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        const Elf64_Phdr *ph =
            (const Elf64_Phdr *)(elf + eh->e_phoff + (size_t)i * eh->e_phentsize);
        if (ph->p_type != PT_NOTE)
            continue;
        size_t off = ph->p_offset, end = ph->p_offset + ph->p_filesz;
        while (off + sizeof(Elf64_Nhdr) <= end) {
            Elf64_Nhdr *nh = (Elf64_Nhdr *)(elf + off);
            size_t name_off = off + sizeof *nh;
            size_t desc_off = name_off + ((nh->n_namesz + 3) & ~3u);
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                memcmp(elf + name_off, "GNU", 4) == 0) {
                for (size_t k = 0; k < nh->n_descsz; k++)
                    elf[desc_off + k] ^= 0x5a;
                patched = 1;
            }
            off = desc_off + ((nh->n_descsz + 3) & ~3u);
        }
    }
    munmap(elf, (size_t)size);
    if (!patched)
        fprintf(stderr, "attack_truncate: no build id note in the copy\n");
}

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: attack_truncate COPY BEFORE_SECONDS TOTAL_SECONDS\n");
        return 2;
    }
    const char *copy = argv[1];
    double before = atof(argv[2]);
    double total = atof(argv[3]);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    Dl_info libc;
    if (!dladdr((void *)&printf, &libc) || !libc.dli_fname)
        die("dladdr(printf)");
    int src = open(libc.dli_fname, O_RDONLY);
    if (src < 0)
        die(libc.dli_fname);
    int fd = open(copy, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0)
        die(copy);
    fchmod(fd, 0644);
    static char buf[1 << 16];
    ssize_t n;
    off_t size = 0;
    while ((n = read(src, buf, sizeof buf)) > 0) {
        if (write(fd, buf, (size_t)n) != n)
            die("write");
        size += n;
    }
    close(src);
    patch_build_id(fd, size);
    char *base = mmap(NULL, (size_t)size, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        die("mmap");

    /* libc's segments have vaddr == file offset, so a function's offset from libc's load base
     * is its offset in the copy. Phase 0 returns to function+1, phase 1 to function+5. */
    uint64_t offsets[NAMES];
    size_t found = 0;
    for (size_t i = 0; i < NAMES; i++) {
        void *sym = dlsym(RTLD_DEFAULT, names[i]);
        Dl_info info;
        if (!sym || !dladdr(sym, &info) || info.dli_fbase != libc.dli_fbase)
            continue;
        uint64_t off = (uint64_t)((char *)sym - (char *)libc.dli_fbase);
        if (off + 16 < (uint64_t)size)
            offsets[found++] = off;
    }
    if (found < 8) {
        fprintf(stderr, "attack_truncate: only %zu libc functions found\n", found);
        return 2;
    }
    for (int phase = 0; phase < 2; phase++)
        for (int c = 0; c < CHAINS; c++)
            for (int f = 0; f < FRAMES; f++) {
                struct frame *fr = &chains[phase][c][f];
                fr->next = f + 1 < FRAMES ? &chains[phase][c][f + 1] : NULL;
                uint64_t off = offsets[(size_t)(c * 7 + f * 13) % found];
                fr->ret = (uint64_t)(uintptr_t)base + off + (phase == 0 ? 1 : 5);
            }
    printf("{\"ready\":true,\"functions\":%zu,\"bytes\":%lld}\n", found, (long long)size);
    fflush(stdout);

    uint64_t start = monotonic_ns();
    uint64_t truncate_at = start + (uint64_t)(before * 1e9);
    uint64_t deadline = start + (uint64_t)(total * 1e9);
    int phase = 0;
    for (uint64_t round = 0; !stop; round++) {
        uint64_t now = monotonic_ns();
        if (now >= deadline)
            break;
        if (phase == 0 && now >= truncate_at) {
            if (ftruncate(fd, 0) != 0)
                die("ftruncate");
            phase = 1;
            printf("{\"truncated\":true}\n");
            fflush(stdout);
        }
        fake_spin(chains[phase][round % CHAINS], 2000000);
    }
    return 0;
}
