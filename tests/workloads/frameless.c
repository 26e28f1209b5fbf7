/*
 * frameless: main -> caller_work -> leaf_work, where the leaf keeps no frame pointer
 * (-momit-leaf-frame-pointer, what several distributions add to -fno-omit-frame-pointer):
 * a frame-pointer walk from the leaf skips caller_work. Runs argv[1] seconds.
 *
 * Build: cc -O2 -g -fno-omit-frame-pointer -momit-leaf-frame-pointer -fno-inline
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

__attribute__((noinline)) void leaf_work(void) {
    uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void caller_work(void) {
    leaf_work();
    sink++;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end)
        caller_work();
    return 0;
}
