/*
 * mixed: an executable without frame pointers calling into a library with them (mixlib.c),
 * which calls back: main -> exe_outer -> lib_entry -> lib_mid -> exe_callback -> exe_leaf.
 * Runs argv[1] seconds.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -fno-inline libmix.so
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef void (*callback)(void);
void lib_entry(callback cb);

static volatile uint64_t sink;

__attribute__((noinline)) void exe_leaf(void) {
    uint64_t acc = sink;
    for (uint64_t i = 200000; i > 0; i--)
        acc = acc * 2862933555777941757ull + 3037000493ull + i;
    sink = acc;
}

__attribute__((noinline)) void exe_callback(void) {
    exe_leaf();
    sink++;
}

__attribute__((noinline)) void exe_outer(void) {
    lib_entry(exe_callback);
    sink++;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end)
        exe_outer();
    return 0;
}
