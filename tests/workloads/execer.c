/*
 * execer: exec in an existing pid. Built twice: -DROLE=1 burns in one_outer -> one_inner for
 * argv[1] seconds, then execs argv[2] (the -DROLE=2 build) in the same pid with argv[3]; the
 * ROLE=2 image burns in two_outer -> two_inner for argv[1] seconds. Built without frame
 * pointers: only the new image's unwind table gives its whole stacks.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -fno-inline -DROLE=N
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef ROLE
#error "build with -DROLE=1 or 2"
#endif
#if ROLE == 1
#define INNER one_inner
#define OUTER one_outer
#else
#define INNER two_inner
#define OUTER two_outer
#endif

static volatile uint64_t sink;

__attribute__((noinline)) void INNER(void) {
    uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void OUTER(void) {
    INNER();
    sink++;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end)
        OUTER();
#if ROLE == 1
    if (argc > 3) {
        char *args[] = {argv[2], argv[3], NULL};
        execv(argv[2], args);
        return 1;
    }
#endif
    return 0;
}
